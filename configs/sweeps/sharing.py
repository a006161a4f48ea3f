"""Sharing of the projections E and F at a fixed k = 32.

The paper's sharing study (Figure 3(c), Table 1): one E and F per head
('none'), per layer ('headwise'), E = F per layer ('kv') or one matrix for the
whole model ('layerwise'), on configs/default.py (n = 128):

  python -m linformer_jax.sweep --sweep configs/sweeps/sharing.py \
      --workdir runs/sweeps/sharing

Each run is configs/default.py's budget (under 10 minutes on a 2-core CPU). It
writes runs/sweeps/sharing/results.md, where the parameter counts fall from
'none' to 'layerwise' while the paper expects similar perplexities, and
perplexity.png.
"""

from configs import default
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  base = default.get_config()
  base.model.projected_len = 32  # k, fixed across the sweep
  return Sweep(
      title='Sharing of E and F (n = 128, k = 32)',  # heading of results.md and the figure
      base=base,  # configs/default.py with the k above
      variants=[
          Variant('none', {'model.sharing': 'none'}),  # E, F for every head of every layer
          Variant('headwise', {'model.sharing': 'headwise'}),  # E, F per layer
          Variant('kv', {'model.sharing': 'kv'}),  # E = F, one per layer
          Variant('layerwise', {'model.sharing': 'layerwise'}),  # E = F for all layers
      ],
  )
