"""Fine-tuning on IMDB movie reviews (2 classes) from a pretraining run.

  python -m linformer_jax.train --config configs/finetune_imdb.py --workdir runs/imdb \
      --config.init_from=runs/gutenberg

or configs/finetune_imdb.py:runs/gutenberg, which also takes the encoder's model
fields and tokenizer from the run (e.g. an imported RoBERTa's).

Reviews average about 300 words, longer than n = 256 tokens: each is cut to
its first and last n/2 - 1 tokens (`truncation='head_tail'`). Trains on
train.tsv, selects on val.tsv (the validation split), and
`python -m linformer_jax.evaluate ... --split test` scores test.tsv. From TFDS:
--config.data.source=tfds --config.data.tfds_name=imdb_reviews
--config.data.text_columns=text --config.data.eval_split=test.
"""

from configs import classification
from configs import from_workdir


def get_config(init_from: str = ''):
  config = classification.get_config()
  config.init_from = ''  # the pretraining run's workdir (e.g. runs/gutenberg)
  config.data.path = '../shared/data/imdb'  # folder with train.tsv, val.tsv, test.tsv
  config.data.split_files = {
      'train': ['train.tsv'],
      'validation': ['val.tsv'],
      'test': ['test.tsv'],
  }
  config.data.tfds_name = 'imdb_reviews'  # used with --config.data.source=tfds
  config.data.text_columns = ('text',)  # the review
  config.data.label_column = 'label'
  config.data.labels = ('0', '1')  # negative, positive
  config.data.truncation = 'head_tail'  # keep the first and last halves of long reviews
  return from_workdir.encoder_of(config, init_from)  # configs/X.py:RUN
