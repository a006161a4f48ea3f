"""Sequence length n = 256, 512 and 1024 at k = 64 on the Gutenberg novels.

The paper's Figure 3(d): with k fixed, the Linformer's perplexity should
change little as n grows. Each n runs the Linformer (k = 64, layerwise
sharing, the paper's learned E), the Transformer, and the Linformer with
fixed local slots (`linformer-mean`). The batch shrinks as n
grows, so every run takes configs/gutenberg.py's 8,192 tokens per step (and
per evaluation batch), the same 500 steps, and scores the same validation
tokens:

  python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg_seq_len.py \
      --workdir runs/sweeps/gutenberg_seq_len

Every run uses seed 1: at this budget whether a run leaves the unigram plateau
by step 500 depends on the seed (docs/results_parity.md), and seed 1's
Linformer at n = 256 leaves it. It writes results.md and perplexity.png, the
table and figure of docs/results_gutenberg.md.
"""

from configs import gutenberg
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

TOKENS_PER_BATCH = 8192  # configs/gutenberg.py: batch 32 of n = 256
LENGTHS = (256, 512, 1024)  # n


# Variant prefix -> its model overrides: the Linformer with the paper's learned
# E, the Transformer, and the Linformer with fixed local slots (each the mean
# of n / k adjacent tokens), which tells the projection's mixing from n itself.
MODELS = {
    'linformer': {'model.attention': 'linformer'},
    'transformer': {'model.attention': 'full'},
    'linformer-mean': {'model.attention': 'linformer', 'model.projection': 'mean'},
}


def _variant(model: str, n: int) -> Variant:
  batch_size = TOKENS_PER_BATCH // n
  return Variant(
      f'{model}-n{n}',
      {
          **MODELS[model],
          'model.max_len': n,
          'batch_size': batch_size,
          'eval_batch_size': batch_size,
      },
  )


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  base.model.projected_len = 64  # k, fixed across the sweep
  base.seed = 1  # see the docstring
  return Sweep(
      title='Sequence length n, Gutenberg novels (k = 64, 8,192 tokens per step)',
      base=base,
      variants=[_variant(model, n) for model in MODELS for n in LENGTHS],
  )
