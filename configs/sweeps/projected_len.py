"""Projected length k: Linformer with k = 16, 32 and 64 against the Transformer.

The paper's Figure 3(a, b) at this project's scale: configs/default.py (n = 128
tokens, the embedded corpus) trained four times, once per row:

  python -m linformer_jax.sweep --sweep configs/sweeps/projected_len.py \
      --workdir runs/sweeps/projected_len

Each run is configs/default.py's budget (under 10 minutes on a 2-core CPU). It
writes runs/sweeps/projected_len/results.md, the validation perplexity of every
k next to the Transformer's, and perplexity.png, their validation perplexity
against steps (log scale). For a quick look, add --set=total_steps=100
--set=warmup_steps=10.
"""

from configs import default
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  return Sweep(
      title='Projected length k (n = 128)',  # heading of results.md and the figure
      base=default.get_config(),  # Linformer, layerwise sharing, linear projection
      variants=[
          Variant('k16', {'model.projected_len': 16}),  # n/k = 8
          Variant('k32', {'model.projected_len': 32}),  # n/k = 4 (the default)
          Variant('k64', {'model.projected_len': 64}),  # n/k = 2
          Variant('transformer', {'model.attention': 'full'}),  # standard attention
      ],
  )
