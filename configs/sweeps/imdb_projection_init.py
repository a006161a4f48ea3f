"""IMDB with a learned E that starts local: does it close the gap?

The paper's learned E starts as a Johnson-Lindenstrauss matrix (`jl`), whose
slots each mix about a third of the row; fixed local slots
(`model.projection='mean'`) closed most of the IMDB gap
(docs/results_parity.md). Here E is learned but starts local (`local`: slot j
the mean of its 4 adjacent tokens, at zero noise exactly projection='mean'),
with its learning rate a tenth of the rest's (`local-lr0.1`: at the full rate
Adam's steps on the unigram plateau, alike for every slot, kept three of four
seeds there), or starts as Glorot uniform (`xavier`); `default` is configs/gutenberg.py's
E as it is now (`local`, its updates centred, a 200-step warm-up), pretrained by
configs/sweeps/gutenberg_plateau.py's `local-centred-warm200-n256-s*`. Each encoder is
configs/gutenberg.py pretrained 500 steps (ENCODERS: the seed with the best
validation perplexity); each is fine-tuned as the imdb_pooling sweep's `mean`
variants (256-token rows, mean pooling, 1,000 steps), three seeds, then
evaluated on the 25,000 test reviews:

  python -m linformer_jax.train --config configs/gutenberg.py --config.seed=0 \
      --workdir runs/parity/pretrain_linformer_init_local_lr0.1_seed0 \
      --config.model.projection_init=local --config.projection_learning_rate_scale=0.1
  python -m linformer_jax.sweep --sweep configs/sweeps/imdb_projection_init.py \
      --workdir runs/parity/imdb_projection_init --only=local-lr0.1-s0,local-lr0.1-s1,local-lr0.1-s2
  python -m linformer_jax.evaluate --config configs/finetune_imdb.py \
      --workdir runs/parity/imdb_projection_init/local-lr0.1-s0 --split test \
      --config.model.pooling=mean --config.model.projection_init=local

The `jl` encoder's runs are the imdb_pooling sweep's `linformer-mean-s*`.
"""

from configs.sweeps import imdb_pooling
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

# Variant prefix -> (pretrained workdir, overrides its fine-tuning shares with it).
ENCODERS = {
    'default': (  # today's default E (local, centred updates, 200-step warm-up), seed 1 (432.7)
        'runs/sweeps/gutenberg_plateau_500/local-centred-warm200-n256-s1',
        {},
    ),
    'local-lr0.1': (
        'runs/parity/pretrain_linformer_init_local_lr0.1_seed0',
        {'model.projection_init': 'local', 'projection_learning_rate_scale': 0.1},
    ),
    'local': (  # seed 1, the one seed of four that left the plateau (598.8)
        'runs/parity/pretrain_linformer_init_local_seed1',
        {'model.projection_init': 'local'},
    ),
    'xavier': (
        'runs/parity/pretrain_linformer_init_xavier',  # seed 0 (455.0)
        {'model.projection_init': 'xavier'},
    ),
}
SEEDS = (0, 1, 2)  # fine-tuning seeds, as the other IMDB runs


def encoder_variants() -> list:
  """Every encoder x fine-tuning seed with mean pooling, named ENCODER-sSEED
  (the SST-2 sweep of these encoders uses them too)."""
  return [
      Variant(
          f'{name}-s{seed}',
          {'init_from': init_from, **overrides, 'model.pooling': 'mean', 'seed': seed},
      )
      for name, (init_from, overrides) in ENCODERS.items()
      for seed in SEEDS
  ]


def get_sweep() -> Sweep:
  return Sweep(
      title='IMDB validation accuracy by initialisation of the learned E (mean pooling)',
      base=imdb_pooling.get_sweep().base,
      variants=encoder_variants(),
  )
