"""A causal (left-to-right) Linformer language model on the Gutenberg novels.

Each query attends exactly to the earlier tokens of its own block of
`block_len` (b) tokens and to `projected_len` (r) learned summaries of every
earlier block, so no position sees a later one (docs/causal_lm.md):

  python -m linformer_jax.train --config configs/causal_lm.py --workdir runs/causal_lm
  python -m linformer_jax.generate --config configs/causal_lm.py --workdir runs/causal_lm \
      --prompt "It was a dark and stormy night" --max_new_tokens 40
  # the Transformer baseline, same model with a full causal mask:
  python -m linformer_jax.train --config configs/causal_lm.py --workdir runs/causal_tf \
      --config.model.attention=full

The tokenizer is the Gutenberg SentencePiece model trained on the training
books (8,000 pieces); --config.data.tokenizer=byte reads UTF-8 bytes instead
(--config.data.vocab_size=260). eval_results.json holds the next-token
eval_loss and eval_perplexity and a unigram model's perplexity. Any max_len
that is a multiple of block_len works (128 to 4096 with the defaults).
"""

from configs import gutenberg


def get_config():
  config = gutenberg.get_config()
  config.task = 'causal_lm'  # next-token prediction
  config.learning_rate = 1e-3  # peak learning rate
  config.total_steps = 500  # optimizer steps
  config.warmup_steps = 50  # 10% of the steps
  model = config.model
  model.causal = True  # left-to-right attention
  model.pre_layer_norm = True  # pre-LN with a final LayerNorm (GPT-2's layout)
  model.max_len = 256  # n: tokens per training sequence, and the longest context
  model.block_len = 32  # b: tokens per block, attended exactly; divides max_len
  model.projected_len = 8  # r: summaries of each earlier block (k per block)
  model.sharing = 'layerwise'  # one E = F for the whole model, as configs/gutenberg.py
  model.projection = 'linear'  # block-diagonal learned E/F; or 'mean', 'max', 'conv', 'random'
  model.query_blocks_per_step = 0  # 0: all query blocks at once; c: c at a time (less memory)
  return config
