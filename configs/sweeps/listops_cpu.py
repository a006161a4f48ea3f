"""ListOps at CPU scale: Linformer (k = 128) against the Transformer, from scratch.

configs/lra_listops_cpu.py (trees of 100-512 tokens, n = 512, 2 layers x 128)
trained once per model and seed, with the validation accuracy every 250 steps
(the curves); then each run's test accuracy:

  python -m linformer_jax.sweep --sweep configs/sweeps/listops_cpu.py \
      --workdir runs/parity/listops_cpu
  python -m linformer_jax.evaluate --config configs/lra_listops_cpu.py \
      --workdir runs/parity/listops_cpu/linformer-s0 --split test

(a Transformer run adds --config.model.attention=full). The majority class is
15.5% of the validation trees and 16.0% of the test trees.
"""

from configs import lra_listops_cpu
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

SEEDS = (0,)  # seeds of each model; add more for error bars


def get_sweep() -> Sweep:
  variants = []
  for seed in SEEDS:
    for attention in ('linformer', 'full'):
      name = 'linformer' if attention == 'linformer' else 'transformer'
      variants.append(Variant(f'{name}-s{seed}', {'model.attention': attention, 'seed': seed}))
  return Sweep(
      title='ListOps at CPU scale (trees of 100-512 tokens)',
      base=lra_listops_cpu.get_config(),
      variants=variants,
  )
