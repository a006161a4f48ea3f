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

The `-long` variants test whether the gap is a slower fine-tuning: the
64-token rows fine-tuned for 4,000 steps (6.4 epochs) instead of 1,000, with
the same 6% warmup:

  python -m linformer_jax.sweep --sweep configs/sweeps/imdb_length.py \
      --workdir runs/parity/imdb_length \
      --only=linformer-len64-long-s0,transformer-len64-long-s0

`linformer-k128-s0` tests the remedy at full length: 2 tokens per slot, from
an encoder pretrained alike with k = 128 (first, then run --only=linformer-k128-s0):

  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_k128 --config.model.projected_len=128

`linformer-local-s0` tests the mechanism at full length: an encoder pretrained
alike with a local projection, each slot the mean of n / k = 4 adjacent tokens,
instead of a learned E whose slots each mix about a third of the row:

  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_local --config.model.projection=mean
"""

from configs.sweeps import imdb_pooling
from configs.sweeps.sst2_pooling import PRETRAINED
from configs.sweeps.sst2_pooling import encoder_overrides
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

ROW_LENGTHS = (64, 128)  # tokens per review row (n stays 256)
SEEDS = (0,)
LOCAL_SEEDS = (0, 1, 2)  # the local-projection encoder's fine-tuning seeds
LONG_STEPS = 4000  # the `-long` variants: 64-token rows fine-tuned 4x longer


def get_sweep() -> Sweep:
  variants = []
  for seed in SEEDS:
    for length in ROW_LENGTHS:
      for model, init_from in PRETRAINED.items():
        overrides = {
            **encoder_overrides(model, init_from),
            'model.pooling': 'mean',
            'data.seq_len': length,
            'seed': seed,
        }
        variants.append(Variant(f'{model}-len{length}-s{seed}', overrides))
        if length == min(ROW_LENGTHS):
          longer = dict(
              overrides,
              total_steps=LONG_STEPS,
              warmup_steps=LONG_STEPS * 6 // 100,
              eval_every=LONG_STEPS // 8,
          )
          variants.append(Variant(f'{model}-len{length}-long-s{seed}', longer))
    wider = {
        'init_from': 'runs/parity/pretrain_linformer_k128',  # configs/gutenberg.py, k = 128
        'model.projected_len': 128,
        'model.pooling': 'mean',
        'seed': seed,
    }
    variants.append(Variant(f'linformer-k128-s{seed}', wider))
  for seed in LOCAL_SEEDS:
    local = {
        'init_from': 'runs/parity/pretrain_linformer_local',  # configs/gutenberg.py, mean
        'model.projection': 'mean',
        'model.pooling': 'mean',
        'seed': seed,
    }
    variants.append(Variant(f'linformer-local-s{seed}', local))
  return Sweep(
      title='IMDB validation accuracy by row length (mean pooling)',
      base=imdb_pooling.get_sweep().base,
      variants=variants,
  )
