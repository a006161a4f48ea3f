"""Sequence length n = 64, 128 and 256 at a fixed k = 32.

The paper's Figure 3(d): with k fixed, Linformer's perplexity should change
little as n grows. The batch shrinks as n grows, so every run takes the same
4,096 tokens per step (and per evaluation batch) and the curves share an x axis:

  python -m linformer_jax.sweep --sweep configs/sweeps/seq_len.py \
      --workdir runs/sweeps/seq_len

Each run is configs/default.py's budget (under 10 minutes on a 2-core CPU at
n = 128). It writes runs/sweeps/seq_len/results.md and perplexity.png.
"""

from configs import default
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def _length(n: int, tokens_per_batch: int = 4096) -> dict:
  batch_size = tokens_per_batch // n
  return {'model.max_len': n, 'batch_size': batch_size, 'eval_batch_size': batch_size}


def get_sweep() -> Sweep:
  base = default.get_config()
  base.model.projected_len = 32  # k, fixed across the sweep
  return Sweep(
      title='Sequence length n (k = 32, 4,096 tokens per step)',  # title of results.md and the plot
      base=base,  # configs/default.py with the k above
      variants=[
          Variant('n64', _length(64)),  # batch 64
          Variant('n128', _length(128)),  # batch 32 (configs/default.py)
          Variant('n256', _length(256)),  # batch 16
      ],
  )
