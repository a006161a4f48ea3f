"""Settings for a run imported from a Hugging Face RoBERTa or BERT checkpoint.

configs/default.py with the Transformer (the checkpoint's own attention) at
n = 512 and a continued-pretraining learning rate. The import replaces the
model's sizes, layer-norm epsilon and segments by the checkpoint's, and the
tokenizer by its tokenizer.json; everything else comes from here:

  python -m linformer_jax.import_checkpoint --from /path/to/roberta-base \
      --workdir runs/roberta --config configs/imported.py

It prints what it took from the checkpoint. A Linformer started from the same
weights (E/F new): --config.model.attention=linformer. Later commands read
the run's saved config back with configs/from_workdir.py (docs/checkpoint_import.md).
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.attention = 'full'  # the checkpoint's attention; 'linformer' adds E/F
  config.model.max_len = 512  # n; at most the checkpoint's positions (512 for RoBERTa, BERT)
  config.model.projected_len = 128  # k, with attention='linformer'
  config.learning_rate = 1e-4  # continued pretraining starts from trained weights
  return config
