"""Pooling on a second short-text task: which of three books a passage is from.

The encoders are the n = 256 runs of configs/sweeps/gutenberg_seq_len.py
(configs/gutenberg.py's budget, seed 1: the Linformer with the paper's learned
E, k = 64, and the Transformer). Each is fine-tuned on the passages of
configs/finetune_book_passages.py with first-token and with mean pooling and
three seeds, so each model's best pooling can be read off:

  python -m linformer_jax.make_book_passages --out runs/data/book_passages
  python -m linformer_jax.sweep --sweep configs/sweeps/book_passages_pooling.py \
      --workdir runs/parity/book_passages

then each run's test accuracy:

  python -m linformer_jax.evaluate --config configs/finetune_book_passages.py \
      --workdir runs/parity/book_passages/linformer-mean-s0 --split test \
      --config.model.pooling=mean

(the Transformer's runs with --config.model.attention=full as well).
"""

from configs import finetune_book_passages
from configs.sweeps import sst2_pooling
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

PRETRAINED = {
    'linformer': 'runs/sweeps/gutenberg_seq_len/linformer-n256',
    'transformer': 'runs/sweeps/gutenberg_seq_len/transformer-n256',
}
POOLINGS = ('first', 'mean')
SEEDS = (0, 1, 2)


def get_sweep() -> Sweep:
  variants = [
      Variant(
          f'{model}-{pooling}-s{seed}',
          {
              **sst2_pooling.encoder_overrides(model, init_from),
              'model.pooling': pooling,
              'seed': seed,
          },
      )
      for seed in SEEDS
      for pooling in POOLINGS
      for model, init_from in PRETRAINED.items()
  ]
  return Sweep(
      title='Book passages: validation accuracy by pooling (Gutenberg pretraining)',
      base=finetune_book_passages.get_config(),
      variants=variants,
  )
