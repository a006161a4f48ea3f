"""SST-2 with a learned E that starts local: the short-text half of parity.

The encoders are imdb_projection_init's (ENCODERS there: configs/gutenberg.py
pretrained 500 steps, E learned from `local` with its learning rate x 0.1, from
`local`, or from `xavier`). Each is fine-tuned as the sst2_pooling sweep's
runs (96-token rows, 2,000 steps, dev accuracy every 250 steps) with mean
pooling, the pooling at which the `jl` Linformer did best there, and three
seeds:

  python -m linformer_jax.sweep --sweep configs/sweeps/sst2_projection_init.py \
      --workdir runs/parity/sst2_projection_init --only=local-lr0.1-s0,local-lr0.1-s1,local-lr0.1-s2

The `jl` encoder's runs are the sst2_pooling sweep's `linformer-mean-s*`.
"""

from configs.sweeps import imdb_projection_init
from configs.sweeps import sst2_pooling
from linformer_jax.sweep import Sweep


def get_sweep() -> Sweep:
  return Sweep(
      title='SST-2 dev accuracy by initialisation of the learned E (mean pooling)',
      base=sst2_pooling.get_sweep().base,
      variants=imdb_projection_init.encoder_variants(),  # the same seeds 0, 1, 2
  )
