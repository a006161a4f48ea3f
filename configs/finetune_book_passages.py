"""Fine-tuning on which of three books a short passage is from.

A short-text task beside SST-2, made from the Gutenberg test books that
pretraining never reads (`linformer_jax.make_book_passages`; 3,393 training,
729 validation and 729 test passages of 23 words on average, every book
equally often):

  python -m linformer_jax.make_book_passages --out runs/data/book_passages
  python -m linformer_jax.train --config configs/finetune_book_passages.py \
      --workdir runs/book_passages --config.init_from=runs/gutenberg

Reports accuracy on dev.tsv; `python -m linformer_jax.evaluate ... --split
test` reads test.tsv. The model fields must be the pretraining run's
(configs/gutenberg.py's by default), as in configs/finetune_sst2.py.
"""

from configs import classification
from configs import from_workdir


def get_config(init_from: str = ''):
  config = classification.get_config()
  config.init_from = ''  # the pretraining run's workdir (e.g. runs/gutenberg)
  config.data.path = 'runs/data/book_passages'  # make_book_passages's --out
  config.data.split_files = {
      'train': ['train.tsv'],
      'validation': ['dev.tsv'],
      'test': ['test.tsv'],
  }
  config.data.text_columns = ('sentence',)  # one passage per example
  config.data.label_column = 'label'
  config.data.labels = ('pg768', 'pg8374', 'pg2496')  # the books' file names
  config.data.seq_len = 96  # passages are cut at 40 words: only padding is cut
  config.total_steps = 400  # optimizer steps (3.8 epochs of 3,393 passages)
  config.warmup_steps = 24  # 6% of the steps
  config.eval_every = 100  # validation accuracy every 100 steps
  config.checkpoint_every = 200  # steps between checkpoints
  return from_workdir.encoder_of(config, init_from)  # configs/X.py:RUN
