"""Fine-tuning on GLUE QNLI (question, sentence pairs; 2 classes).

  python -m linformer_jax.train --config configs/finetune_qnli.py --workdir runs/qnli \
      --config.init_from=runs/gutenberg

or configs/finetune_qnli.py:runs/gutenberg, which also takes the encoder's model
fields and tokenizer from the run (e.g. an imported RoBERTa's).

Pairs are encoded `[bos] question [eos] [eos] sentence [eos]` with segment ids
0 / 1 and a segment embedding (zeros at the start, so the pretrained encoder
is unchanged until it learns). Reads TFDS glue/qnli (prepare it with
`tfds build glue/qnli`, or --config.data.tfds_download=True with network);
GLUE's own QNLI TSV files work too: --config.data.source=tsv
--config.data.path=DIR (columns index, question, sentence, label). QQP:
--config.data.tfds_name=glue/qqp
--config.data.text_columns="('question1','question2')"
--config.data.labels="('not_duplicate','duplicate')".
"""

from configs import classification
from configs import from_workdir


def get_config(init_from: str = ''):
  config = classification.get_config()
  config.init_from = ''  # the pretraining run's workdir (e.g. runs/gutenberg)
  config.data.source = 'tfds'  # TFDS glue/qnli; 'tsv' for GLUE's files
  config.data.tfds_name = 'glue/qnli'
  config.data.path = ''  # folder of GLUE's QNLI train.tsv / dev.tsv (source='tsv')
  config.data.split_files = {'train': ['train.tsv'], 'validation': ['dev.tsv']}
  config.data.text_columns = ('question', 'sentence')  # a pair per example
  config.data.label_column = 'label'
  config.data.labels = ('entailment', 'not_entailment')  # TFDS labels 0 and 1
  config.model.num_segments = 2  # segment embeddings for the two texts
  return from_workdir.encoder_of(config, init_from)  # configs/X.py:RUN
