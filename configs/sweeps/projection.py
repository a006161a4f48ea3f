"""How keys and values are compressed to k = 32 positions.

The paper's learned linear projection against a fixed random one and against
the pooling and strided convolution it names as alternatives (section 4), on
configs/default.py (n = 128, so pooling windows of n/k = 4 tokens):

  python -m linformer_jax.sweep --sweep configs/sweeps/projection.py \
      --workdir runs/sweeps/projection

Each run is configs/default.py's budget (under 10 minutes on a 2-core CPU). It
writes runs/sweeps/projection/results.md and perplexity.png.
"""

from configs import default
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  base = default.get_config()
  base.model.projected_len = 32  # k, fixed across the sweep
  return Sweep(
      title='Projection of keys and values (n = 128, k = 32)',  # title of results.md and the plot
      base=base,  # configs/default.py with the k above
      variants=[
          Variant('linear', {'model.projection': 'linear'}),  # learned E, F (the paper)
          Variant('random', {'model.projection': 'random'}),  # fixed random E, F
          Variant('mean', {'model.projection': 'mean'}),  # average over windows of n/k
          Variant('max', {'model.projection': 'max'}),  # maximum over windows of n/k
          Variant('conv', {'model.projection': 'conv'}),  # learned strided convolution
      ],
  )
