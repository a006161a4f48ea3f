"""Projected length k on the Gutenberg novels: k = 32, 64, 128 and the Transformer.

configs/sweeps/projected_len.py on the 64 Project Gutenberg novels of
../shared/data/gutenberg, with configs/gutenberg.py's longer sequences
(n = 256), so k runs over n/8, n/4 and n/2 as in the paper's Figure 3(a, b):

  python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg_k.py \
      --workdir runs/sweeps/gutenberg_k

It writes runs/sweeps/gutenberg_k/results.md and perplexity.png. Each run is
configs/gutenberg.py's 2,000 steps; run from the repository root, or pass
--set=data.path=... to point at the books from elsewhere.
"""

from configs import gutenberg
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  return Sweep(
      title='Projected length k, Gutenberg novels (n = 256)',  # heading of results.md and the figure
      base=base,  # configs/gutenberg.py with the data path above
      variants=[
          Variant('k32', {'model.projected_len': 32}),  # n/k = 8
          Variant('k64', {'model.projected_len': 64}),  # n/k = 4 (configs/gutenberg.py)
          Variant('k128', {'model.projected_len': 128}),  # n/k = 2
          Variant('transformer', {'model.attention': 'full'}),  # standard attention
      ])
