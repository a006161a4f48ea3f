"""Fine-tuning on GLUE SST-2 (single sentences, 2 classes) from a pretraining run.

Pretrain on the Gutenberg novels first, then fine-tune its encoder:

  python -m linformer_jax.train --config configs/gutenberg.py --workdir runs/gutenberg
  python -m linformer_jax.train --config configs/finetune_sst2.py --workdir runs/sst2 \
      --config.init_from=runs/gutenberg

The model fields must be the pretraining run's (configs/gutenberg.py's by
default); the run refuses a mismatch, naming the field. Naming the run in the
config instead, configs/finetune_sst2.py:runs/gutenberg, sets init_from and
takes the encoder's fields and tokenizer from the run (any run, e.g. an
imported RoBERTa). Reports accuracy on
dev.tsv (GLUE's practice). From TFDS instead of the local files:
--config.data.source=tfds --config.data.tfds_name=glue/sst2. The Transformer:
--config.model.attention=full (with a Transformer pretraining run).
"""

from configs import classification
from configs import from_workdir


def get_config(init_from: str = ''):
  config = classification.get_config()
  config.init_from = ''  # the pretraining run's workdir (e.g. runs/gutenberg)
  config.data.path = '../shared/data/glue_sst2'  # folder with train.tsv and dev.tsv
  config.data.split_files = {'train': ['train.tsv'], 'validation': ['dev.tsv']}
  config.data.tfds_name = 'glue/sst2'  # used with --config.data.source=tfds
  config.data.text_columns = ('sentence',)  # one sentence per example
  config.data.label_column = 'label'
  config.data.labels = ('0', '1')  # negative, positive
  return from_workdir.encoder_of(config, init_from)  # configs/X.py:RUN
