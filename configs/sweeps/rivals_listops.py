"""Every attention kind on ListOps at CPU scale, from scratch.

configs/lra_listops_cpu.py (trees of 100-512 tokens, n = 512, 2 layers x 128,
2,000 steps of batch 32), each kind at the budget of configs/sweeps/_rivals.py
(r = n / 4 = 128 keys or rank per query); seed 0 for every kind, then seeds 1
and 2 for the Linformer, the Transformer and the best rival (--only picks them):

  python -m linformer_jax.sweep --sweep configs/sweeps/rivals_listops.py \
      --workdir runs/sweeps/rivals_listops

It writes results.md (validation accuracy per run); the table is in
docs/results_rivals.md. The majority class is 15.5% of the validation trees.
"""

from configs import lra_listops_cpu
from configs.sweeps import _rivals
from linformer_jax.sweep import Sweep

SEEDS = (0, 1, 2)


def get_sweep() -> Sweep:
  return Sweep(
      title='Attention kinds, ListOps at CPU scale (n = 512, budget n / 4)',
      base=lra_listops_cpu.get_config(),
      variants=_rivals.variants((512,), SEEDS),
  )
