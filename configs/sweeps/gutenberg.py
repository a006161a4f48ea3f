"""Projected length k and sharing of E/F on the Gutenberg novels, with the Transformer.

configs/gutenberg.py (n = 256, layerwise sharing) on the 64 Project Gutenberg
novels of ../shared/data/gutenberg: k runs over n/8, n/4 and n/2 as in the
paper's Figure 3(a, b), and at k = 64 the other sharing modes of Figure 3(c)
(one E and F per layer, 'headwise'; E = F per layer, 'kv') join layerwise
sharing (one matrix for the whole model, the k64 row):

  python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg.py \
      --workdir runs/sweeps/gutenberg

It writes runs/sweeps/gutenberg/results.md and perplexity.png (the table and figure of
docs/results_gutenberg.md). Each run is configs/gutenberg.py's budget;
run from the repository root, or pass --set=data.path=... to point at the books
from elsewhere.
"""

from configs import gutenberg
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  return Sweep(
      title='k and sharing, Gutenberg novels (n = 256)',  # heading of results.md and the figure
      base=base,  # configs/gutenberg.py with the data path above
      variants=[
          Variant('transformer', {'model.attention': 'full'}),  # standard attention
          Variant('k32', {'model.projected_len': 32}),  # n/k = 8, layerwise
          Variant('k64', {'model.projected_len': 64}),  # n/k = 4, layerwise (configs/gutenberg.py)
          Variant('k128', {'model.projected_len': 128}),  # n/k = 2, layerwise
          Variant('k64_headwise', {'model.sharing': 'headwise'}),  # E, F per layer
          Variant('k64_kv', {'model.sharing': 'kv'}),  # E = F, one per layer
      ],
  )
