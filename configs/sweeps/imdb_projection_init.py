"""IMDB with a learned E that starts local: does the initialisation close the gap?

The paper's learned E starts as a Johnson-Lindenstrauss matrix (`jl`), whose
slots each mix about a third of the row; fixed local slots
(`model.projection='mean'`) closed most of the IMDB gap
(docs/results_parity.md). Here E is learned but starts local (`local`: slot j
the mean of its 4 adjacent tokens, at zero noise exactly projection='mean') or
as Glorot uniform (`xavier`). Pretrain the two encoders as the other parity
encoders were (configs/gutenberg.py, 500 steps), then fine-tune each on IMDB
as the imdb_pooling sweep's `mean` variants (256-token rows, mean pooling,
1,000 steps), three seeds, and evaluate on the 25,000 test reviews:

  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_init_local --config.model.projection_init=local
  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_init_xavier --config.model.projection_init=xavier
  python -m linformer_jax.sweep --sweep configs/sweeps/imdb_projection_init.py \
      --workdir runs/parity/imdb_projection_init
  python -m linformer_jax.evaluate --config configs/finetune_imdb.py \
      --workdir runs/parity/imdb_projection_init/linformer-init-local-s0 --split test \
      --config.model.pooling=mean

The `jl` encoder's runs are the imdb_pooling sweep's `linformer-mean-s*`.
"""

from configs.sweeps import imdb_pooling
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

INITS = ('local', 'xavier')  # model.projection_init of the pretrained encoders
SEEDS = (0, 1, 2)  # fine-tuning seeds, as the other IMDB runs


def get_sweep() -> Sweep:
  variants = [
      Variant(
          f'linformer-init-{init}-s{seed}',
          {
              'init_from': f'runs/parity/pretrain_linformer_init_{init}',
              'model.projection_init': init,
              'model.pooling': 'mean',
              'seed': seed,
          },
      )
      for seed in SEEDS
      for init in INITS
  ]
  return Sweep(
      title='IMDB validation accuracy by initialisation of the learned E (mean pooling)',
      base=imdb_pooling.get_sweep().base,
      variants=variants,
  )
