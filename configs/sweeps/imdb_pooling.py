"""Downstream parity on IMDB: Linformer against the Transformer, by pooling.

The encoders and variants of configs/sweeps/sst2_pooling.py (pretrain them
first, with the commands there), fine-tuned on IMDB reviews (cut to their first
and last 127 tokens) and selected on val.tsv; then each variant's test accuracy:

  python -m linformer_jax.sweep --sweep configs/sweeps/imdb_pooling.py \
      --workdir runs/parity/imdb
  python -m linformer_jax.evaluate --config configs/finetune_imdb.py \
      --workdir runs/parity/imdb/linformer-mean-s0 --split test --config.model.pooling=mean

(a Transformer variant adds --config.model.attention=full; `evaluate` writes
eval_test.json in the variant's folder). Each run is 1,000 steps of batch 32,
1.6 epochs of train.tsv's 20,000 reviews, with the accuracy on a fixed random
1,600 of val.tsv's 5,000 reviews every 250 steps (the curves; the test split
is the full 25,000). Reviews fill all n = 256 tokens, so a run costs about
eight times an SST-2 run of the same steps: run the default pooling first,
e.g. --only=linformer-mean-s0,transformer-mean-s0,linformer-mean-s1,...

`linformer-first-long-s0` asks whether a longer fine-tuning closes the
first-token gap: the Linformer's `first` run of seed 0 for 3,000 steps (4.8
epochs), with its warm-up and decay stretched alike.
"""

from configs import finetune_imdb
from configs.sweeps.sst2_pooling import pooling_variants
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

LONG_STEPS = 3000  # linformer-first-long-s0: 3x the steps (4.8 epochs)


def get_sweep() -> Sweep:
  base = finetune_imdb.get_config()
  base.total_steps = 1000  # optimizer steps (1.6 epochs)
  base.warmup_steps = 60  # 6% of the steps
  base.data.max_eval_batches = 50  # 1,600 validation reviews for the curves
  base.eval_every = 250  # val.tsv accuracy every 250 steps: the curves
  base.checkpoint_every = 250  # an interrupted variant resumes from here
  variants = pooling_variants()
  return Sweep(
      title='IMDB validation accuracy by pooling (Gutenberg pretraining)',
      base=base,
      variants=variants + [longer_first_token_run(variants)],
  )


def longer_first_token_run(variants: list) -> Variant:
  """The Linformer's `first` run of seed 0, fine-tuned LONG_STEPS steps."""
  first = next(v for v in variants if v.name == 'linformer-first-s0')
  longer = dict(first.overrides, total_steps=LONG_STEPS, warmup_steps=LONG_STEPS * 6 // 100)
  return Variant('linformer-first-long-s0', longer)
