"""Every attention kind at one budget, shared by the rivals_* sweep files.

The budget is r = n / 4 positions (or rank) per query, the Linformer's k = n / 4
of configs/gutenberg.py, given to each kind in its own terms:

- linformer: k = r.
- performer: r random features.
- nystromformer: r landmarks, no convolutional skip.
- reformer: 2 hash rounds, buckets of r / 4; each round a query sees its
  chunk and the one before, 2 x r / 4 keys.
- longformer: a window of r (r / 2 each side), no global tokens (every task
  here pools all positions or scores each one).
- bigbird: blocks of r / 8; 3 window, 2 global and 3 random blocks, 8 blocks
  of keys per query block.
- sparse_transformer: the fixed pattern, blocks of r / 2 ending in r / 16
  summary positions; r / 2 local keys and n / 8 = r / 2 summary keys.

The Transformer ('full') sees all n. Sizes are rounded to whole positions.

Dropout is the same for every kind: 0.1 on the embeddings, each residual
branch and the MLP's hidden (`DROPOUT`), none on attention weights, which
the feature-map kinds (performer, linear_transformer) never form and the
rivals with their own softmax do not drop out.
"""

from typing import Any, Dict, Sequence

from linformer_jax.model import attention_kinds
from linformer_jax.sweep import Variant

# Every built-in kind, 'full' first (the rows compare against it), then the
# Linformer, then the rivals in the order of docs/training.md.
KINDS = attention_kinds.BUILT_IN


# One regularisation for all kinds: no kind has dropout another lacks.
DROPOUT = {'model.attention_dropout_rate': 0.0, 'model.activation_dropout_rate': 0.1}


def budget(kind: str, n: int) -> Dict[str, Any]:
  """The dotted overrides that give `kind` the budget r = n / 4 at length n."""
  r = n // 4
  if kind == 'linformer':
    return {'model.projected_len': r}
  if kind == 'performer':
    return {'model.performer_features': r}
  if kind == 'nystromformer':
    return {'model.nystrom_landmarks': r, 'model.nystrom_conv_kernel': 0}
  if kind == 'reformer':
    return {'model.reformer_n_hashes': 2, 'model.reformer_bucket_size': round(r / 4)}
  if kind == 'longformer':
    return {'model.longformer_window': 2 * round(r / 2), 'model.longformer_global_tokens': 0}
  if kind == 'bigbird':
    return {
        'model.bigbird_block_size': round(r / 8),
        'model.bigbird_global_blocks': 2,
        'model.bigbird_random_blocks': 3,
    }
  if kind == 'sparse_transformer':
    return {
        'model.sparse_pattern': 'fixed',
        'model.sparse_block_size': round(r / 2),
        'model.sparse_summary_size': round(r / 16),
    }
  return {}  # full attention, the linear transformer: no budget to set


def variants(lengths: Sequence[int], seeds: Sequence[int], **shared: Any) -> list:
  """A variant '<kind>-n<n>-s<seed>' for every kind, n and seed, seed-major
  (every kind at the first seed trains before any second seed), each with
  `shared` overrides (e.g. the batch size for that n, given as a function of n)
  and the shared `DROPOUT`."""
  runs = []
  for seed in seeds:
    for n in lengths:
      for kind in KINDS:
        extra = {key: value(n) if callable(value) else value for key, value in shared.items()}
        overrides = {'model.attention': kind, 'model.max_len': n, 'seed': seed, **DROPOUT}
        runs.append(Variant(f'{kind}-n{n}-s{seed}', {**overrides, **budget(kind, n), **extra}))
  return runs
