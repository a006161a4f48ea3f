"""Long Range Arena byte-level text classification (IMDB), trained from scratch.

  python -m linformer_jax.train --config configs/lra_text.py --workdir runs/lra_text
  python -m linformer_jax.train --config configs/lra_text.py --workdir runs/lra_text_tf \
      --config.model.attention=full

Reviews are read as UTF-8 bytes (a 256-symbol vocabulary plus pad/bos/eos/
mask) from ../shared/data/imdb and cut to their first n - 2 bytes; the LRA
uses n from 1,000 to 4,000 (--config.model.max_len=4000). The model is the
LRA's text size (4 layers, 256 wide, 4 heads, MLP 1024, mean pooling; 20,000
steps of batch 32); Linformer uses k = 256 with one projection per layer.
Reports accuracy on val.tsv; `evaluate --split test` scores test.tsv.
"""

from configs import classification


def get_config():
  config = classification.get_config()
  config.data.path = '../shared/data/imdb'  # folder with train.tsv, val.tsv, test.tsv
  config.data.split_files = {
      'train': ['train.tsv'],
      'validation': ['val.tsv'],
      'test': ['test.tsv'],
  }
  config.data.tfds_name = 'imdb_reviews'  # used with --config.data.source=tfds
  config.data.text_columns = ('text',)
  config.data.labels = ('0', '1')  # negative, positive
  config.data.tokenizer = 'byte'  # UTF-8 bytes, no learned vocabulary
  config.data.vocab_size = 260  # 256 bytes + pad, bos, eos, mask
  config.data.truncation = 'head'  # the first n - 2 bytes of each review
  config.total_steps = 20000  # LRA: 20,000 steps of batch 32
  config.warmup_steps = 8000  # LRA
  config.learning_rate = 5e-4  # peak learning rate
  config.eval_every = 1000
  config.checkpoint_every = 2000
  model = config.model
  model.max_len = 1000  # n (bytes), the LRA's shortest text setting
  model.projected_len = 256  # k
  # The paper's N(0, 1/k) E: 'local', the default, needs k to divide n.
  model.projection_init = 'jl'
  model.sharing = 'headwise'  # one E, F per layer
  model.num_layers = 4  # LRA text size
  model.num_heads = 4
  model.hidden_dim = 256
  model.mlp_dim = 1024
  model.pooling = 'mean'
  return config
