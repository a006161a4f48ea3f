"""Tiny settings for tests and smoke runs: a few seconds on a CPU.

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/tiny

It prints a handful of progress lines and a validation perplexity (far from
good: the model is tiny and trains for 20 steps).
"""

from configs import default


def get_config():
  config = default.get_config()
  config.total_steps = 20
  config.batch_size = 4
  config.eval_batch_size = 4
  config.warmup_steps = 5
  config.log_every = 5
  config.eval_every = 10
  config.checkpoint_every = 10
  config.data.tokenizer = 'byte'
  config.data.vocab_size = 260
  config.data.max_eval_batches = 2
  config.model.max_len = 32
  config.model.projected_len = 8
  config.model.num_layers = 2
  config.model.num_heads = 2
  config.model.hidden_dim = 32
  config.model.mlp_dim = 64
  return config
