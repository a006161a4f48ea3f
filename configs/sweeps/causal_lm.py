"""The causal Linformer at several block lengths b and slots r, against the
causal Transformer, on the Gutenberg novels (configs/causal_lm.py, n = 256):

  python -m linformer_jax.sweep --sweep configs/sweeps/causal_lm.py \
      --workdir runs/sweeps/causal_lm

Each run is configs/causal_lm.py's budget (500 steps of batch 32). results.md
holds every variant's next-token validation perplexity, the unigram model's
and the wall time; perplexity.png the validation perplexity against steps. A
query sees the b tokens of its block (up to itself) and r summaries of each
earlier block: at most b + (n/b - 1) * r keys, against the Transformer's n.
"""

from configs import causal_lm
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep() -> Sweep:
  return Sweep(
      title='Causal Linformer: block length b and slots r (n = 256)',
      base=causal_lm.get_config(),  # b = 32, r = 8, layerwise sharing, linear
      variants=[
          Variant('transformer', {'model.attention': 'full'}),  # full causal mask: 256 keys
          Variant('b32-r8', {}),  # the default: at most 32 + 7 * 8 = 88 keys
          Variant('b32-r4', {'model.projected_len': 4}),  # at most 60 keys
          Variant('b16-r4', {'model.block_len': 16, 'model.projected_len': 4}),  # 76 keys
          Variant('b64-r16', {'model.block_len': 64, 'model.projected_len': 16}),  # 112 keys
          Variant('b32-r8-mean', {'model.projection': 'mean'}),  # mean-pooled summaries
      ],
  )
