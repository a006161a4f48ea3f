"""Every attention kind on LRA byte-level text (IMDB as bytes), n = 1000, from scratch.

configs/lra_text.py at docs/fine_tuning.md's CPU budget (2 layers x 64, 4
heads, MLP 128, 200 steps of batch 16), each kind at the budget of
configs/sweeps/_rivals.py (r = 250 keys or rank per query); seed 0 for every
kind, then seeds 1 and 2 for the Linformer, the Transformer and the best
rival (--only picks them):

  python -m linformer_jax.sweep --sweep configs/sweeps/rivals_text.py \
      --workdir runs/sweeps/rivals_text

It writes results.md (validation accuracy per run, 5,000 balanced reviews);
the table is in docs/results_rivals.md.
"""

from configs import lra_text
from configs.sweeps import _rivals
from linformer_jax.sweep import Sweep

SEEDS = (0, 1, 2)


def get_sweep() -> Sweep:
  base = lra_text.get_config()
  base.model.num_layers = 2  # docs/fine_tuning.md's CPU size
  base.model.hidden_dim = 64
  base.model.num_heads = 4
  base.model.mlp_dim = 128
  base.batch_size = 16
  base.total_steps = 200
  base.warmup_steps = 20
  base.eval_every = 100  # step 100 and step 200
  base.checkpoint_every = 100
  return Sweep(
      title='Attention kinds, byte-level text (n = 1000, budget n / 4)',
      base=base,
      variants=_rivals.variants((1000,), SEEDS),
  )
