"""Downstream parity: Linformer against the Transformer on SST-2, by pooling.

Both encoders are pretrained with configs/gutenberg.py's budget (n = 256, the
Linformer with k = 64), then fine-tuned on SST-2 with each classifier pooling
(`first`: the <s> token; `mean`; `attention`: a learned query) and three seeds,
reporting dev accuracy every 250 steps:

  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer
  python -m linformer_jax.train --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_transformer --config.model.attention=full
  python -m linformer_jax.sweep --sweep configs/sweeps/sst2_pooling.py \
      --workdir runs/parity/sst2

The variants run seed by seed and the two models side by side, so each pair
of runs compares one pooling and the first six give a one-seed comparison.
results.md holds every run and the mean ± std over seeds; accuracy.png the dev
accuracy against steps. Each run is 2,000 steps of batch 32 (0.95 of an
epoch): about 27 minutes for the Linformer and 37 for the Transformer on a
2-core CPU, at the rates of the SST-2 runs in docs/fine_tuning.md.
"""

from configs import finetune_sst2
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

PRETRAINED = {
    'linformer': 'runs/parity/pretrain_linformer',  # configs/gutenberg.py
    'transformer': 'runs/parity/pretrain_transformer',  # the same, attention='full'
}
POOLINGS = ('first', 'mean', 'attention')
SEEDS = (0, 1, 2)


def encoder_overrides(model: str, init_from: str) -> dict:
  """The overrides that fine-tune PRETRAINED[model] (read from init_from)."""
  return {
      'init_from': init_from,
      'model.attention': 'linformer' if model == 'linformer' else 'full',
  }


def pooling_variants() -> list:
  """Every seed x pooling x model, seed by seed and the two models side by
  side, named MODEL-POOLING-sSEED."""
  variants = []
  for seed in SEEDS:
    for pooling in POOLINGS:
      for model, init_from in PRETRAINED.items():
        overrides = {
            **encoder_overrides(model, init_from),
            'model.pooling': pooling,
            'seed': seed,
        }
        variants.append(Variant(f'{model}-{pooling}-s{seed}', overrides))
  return variants


def get_sweep() -> Sweep:
  base = finetune_sst2.get_config()
  base.data.seq_len = 96  # the longest sentence is 93 tokens: only padding is cut
  base.total_steps = 2000  # optimizer steps (0.95 of an epoch of 67,349 sentences)
  base.warmup_steps = 120  # 6% of the steps
  base.eval_every = 250  # dev accuracy every 250 steps: the curves
  base.checkpoint_every = 250  # an interrupted variant resumes from here
  return Sweep(
      title='SST-2 dev accuracy by pooling (Gutenberg pretraining)',
      base=base,
      variants=pooling_variants(),
  )
