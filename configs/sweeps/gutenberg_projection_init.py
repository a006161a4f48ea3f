"""k = 32, 64 and 128 on the Gutenberg novels, with E learned from `jl` or from `local`.

Does a learned E that starts local keep the paper's Figure 3 (perplexity
across k) as well as the Johnson-Lindenstrauss start does? Each k runs
configs/gutenberg.py (n = 256, layerwise sharing, 500 steps) twice: E drawn
N(0, 1/k) (`jl`, the default) and E starting as the mean of its n / k
adjacent tokens, learned at a tenth of the other weights' learning rate
(`local-lr0.1`, the choice docs/results_parity.md found for long texts):

  python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg_projection_init.py \
      --workdir runs/sweeps/gutenberg_projection_init

It writes results.md and perplexity.png; docs/results_parity.md's table adds
each run's perplexity by step and projection_stats of E. At this budget
whether a run leaves the unigram plateau by step 500 depends on its seed;
`--set=seed=S` with another workdir repeats the sweep with another seed.
"""

from configs import gutenberg
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

PROJECTED_LENGTHS = (32, 64, 128)  # k, n / 8 to n / 2

# Variant prefix -> how E starts and learns.
INITS = {
    'jl': {'model.projection_init': 'jl'},
    'local-lr0.1': {'model.projection_init': 'local', 'projection_learning_rate_scale': 0.1},
}


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  return Sweep(
      title='k by initialisation of the learned E, Gutenberg novels (n = 256)',
      base=base,
      variants=[
          Variant(f'{init}-k{k}', {**overrides, 'model.projected_len': k})
          for k in PROJECTED_LENGTHS
          for init, overrides in INITS.items()
      ],
  )
