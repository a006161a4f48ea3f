"""IMDB by row length: does the Linformer's gap grow with real tokens per slot?

The encoders of configs/sweeps/sst2_pooling.py (k = 64 slots at n = 256),
fine-tuned on IMDB as in configs/sweeps/imdb_pooling.py with mean pooling, but
with reviews cut to rows of 64 or 128 tokens (their first and last halves,
`data.seq_len`) instead of 256. A row of L tokens puts L real tokens into the
Linformer's 64 slots: 1, 2 or 4 tokens per slot, against the Transformer,
which attends to every token at any length:

  python -m linformer_jax.sweep --sweep configs/sweeps/imdb_length.py \
      --workdir runs/parity/imdb_length
  python -m linformer_jax.evaluate --config configs/finetune_imdb.py \
      --workdir runs/parity/imdb_length/linformer-len64-s0 --split test \
      --config.data.seq_len=64 --config.model.pooling=mean

(a Transformer variant adds --config.model.attention=full). The 256-token rows
are the imdb_pooling sweep's `mean` variants.

`linformer-k128-s0` tests the remedy at full length: 2 tokens per slot, from
an encoder pretrained alike with k = 128 (first, then run --only=linformer-k128-s0):

  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_k128 --config.model.projected_len=128
"""

from configs.sweeps import imdb_pooling
from configs.sweeps.sst2_pooling import PRETRAINED
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

ROW_LENGTHS = (64, 128)  # tokens per review row (n stays 256)
SEEDS = (0,)


def get_sweep() -> Sweep:
  variants = []
  for seed in SEEDS:
    for length in ROW_LENGTHS:
      for model, init_from in PRETRAINED.items():
        overrides = {
            'init_from': init_from,
            'model.attention': 'linformer' if model == 'linformer' else 'full',
            'model.pooling': 'mean',
            'data.seq_len': length,
            'seed': seed,
        }
        variants.append(Variant(f'{model}-len{length}-s{seed}', overrides))
    wider = {
        'init_from': 'runs/parity/pretrain_linformer_k128',  # configs/gutenberg.py, k = 128
        'model.projected_len': 128,
        'model.pooling': 'mean',
        'seed': seed,
    }
    variants.append(Variant(f'linformer-k128-s{seed}', wider))
  return Sweep(
      title='IMDB validation accuracy by row length (mean pooling)',
      base=imdb_pooling.get_sweep().base,
      variants=variants,
  )
