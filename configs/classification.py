"""Base of the sequence-classification configs (fine-tuning and the LRA).

Not run by itself: configs/finetune_*.py and configs/lra_*.py start from it.
It is configs/gutenberg.py's model (so a Gutenberg pretraining run can be
fine-tuned as it is) with `task = 'classification'` and the data fields of
linformer_jax/data/classification.py and linformer_jax/data/labelled_examples.py.
"""

from configs import gutenberg


def get_config():
  config = gutenberg.get_config()
  config.task = 'classification'
  config.init_from = ''  # pretraining run whose encoder to start from ('' = scratch)
  config.total_steps = 1000  # optimizer steps
  config.warmup_steps = 60  # about 6% of the steps, as RoBERTa's fine-tuning
  config.learning_rate = 3e-4  # peak learning rate (small models; RoBERTa-base used 1e-5 to 3e-5)
  config.batch_size = 32  # examples per step
  config.eval_every = 200  # steps between validation evaluations
  config.checkpoint_every = 500  # steps between checkpoints
  config.weight_decay = 0.1  # AdamW weight decay (matrices only)

  data = config.data
  data.source = 'tsv'  # 'tsv' (local files), 'tfds' or 'listops'
  data.path = ''  # folder of the TSV files (source='tsv')
  data.split_files = {}  # split -> list of TSV files in data.path
  data.text_columns = ('sentence',)  # 1 column (single texts) or 2 (pairs)
  data.label_column = 'label'  # column / TFDS feature holding the label
  data.labels = ('0', '1')  # label values, in class-index order
  data.seq_len = 0  # tokens per example, <= model.max_len (0 = max_len); shorter is exact, faster
  data.truncation = 'head'  # longer texts: keep the 'head' or 'head_tail' halves
  data.max_train_examples = 0  # use a random subset of the training split (0 = all)
  data.max_eval_batches = 0  # evaluate a fixed random subset of this many batches (0 = all)
  data.listops = {}  # ListOps generator settings (source='listops'), see lra_listops.py
  config.model.dropout_rate = 0.1  # dropout, also on the classification head
  # Classifier input: the mean of the real tokens' outputs. It fine-tunes the
  # Linformer as well as the Transformer, where the <s> token ('first', RoBERTa's
  # choice) falls behind: docs/results_parity.md. 'first' and 'attention' remain.
  config.model.pooling = 'mean'
  return config
