"""Every attention kind on the Gutenberg novels' masked LM, n = 512 and 1024, 2 seeds.

configs/gutenberg.py's model and budget (3 layers x 128, 500 steps, 8,192
tokens per step, so batch 16 at n = 512 and 8 at n = 1024), with each kind
at the budget of configs/sweeps/_rivals.py (r = n / 4 keys or rank per
query). Every seed-0 run trains before any seed-1 run:

  python -m linformer_jax.sweep --sweep configs/sweeps/rivals_gutenberg.py \
      --workdir runs/sweeps/rivals_gutenberg

It writes results.md (validation perplexity per run) and perplexity.png; the
table is in docs/results_rivals.md.
"""

from configs import gutenberg
from configs.sweeps import _rivals
from linformer_jax.sweep import Sweep

TOKENS_PER_BATCH = 8192  # configs/gutenberg.py: batch 32 of n = 256
LENGTHS = (512, 1024)  # n
SEEDS = (0, 1)


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  per_n = lambda n: TOKENS_PER_BATCH // n
  return Sweep(
      title='Attention kinds, Gutenberg novels (budget n / 4, 8,192 tokens per step)',
      base=base,
      variants=_rivals.variants(LENGTHS, SEEDS, batch_size=per_n, eval_batch_size=per_n),
  )
