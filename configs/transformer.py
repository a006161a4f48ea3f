"""The Transformer baseline of configs/default.py: the same model, full attention.

  python -m linformer_jax.train --config configs/transformer.py --workdir runs/transformer

It prints validation perplexity on the embedded corpus to compare with
configs/default.py (see README, "Results").
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'full'
  return config
