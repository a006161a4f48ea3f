"""Masked-LM pretraining on the 64 Project Gutenberg novels in ../shared/data.

Splits follow ../shared/data/README.md (whole books never cross splits):

  python -m linformer_jax.train --config configs/gutenberg.py --workdir runs/gutenberg \
      --config.data.path=../shared/data/gutenberg

At this small CPU scale it prints a validation perplexity in the table of
docs/results_gutenberg.md.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.data.source = 'text_files'
  config.data.path = '../shared/data/gutenberg'  # folder of pg*.txt books
  config.data.split_files = {
      'validation': ['pg345.txt', 'pg174.txt', 'pg42.txt'],
      'test': ['pg768.txt', 'pg8374.txt', 'pg2496.txt'],
  }
  config.data.max_eval_batches = 50  # cap; the 3 validation books give 45 batches of 32
  config.model.max_len = 256  # n
  config.model.projected_len = 64  # k = n/4
  config.total_steps = 500  # optimizer steps; about 10 minutes per run on a 2-core CPU
  config.eval_every = 100  # steps between validation evaluations
  config.checkpoint_every = 250  # steps between checkpoints
  return config
