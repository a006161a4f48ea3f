"""Which recipe lets the paper's learned E leave the unigram plateau at every n?

At k = 64, configs/gutenberg.py's learned E (drawn N(0, 1/k), `jl`) stays on
the unigram plateau (perplexity about 700) at n = 512 and 1024 with every seed
tried, and at n = 256 with seed 0 (docs/results_gutenberg.md). Each variant
here is a recipe at one n and seed; the screen runs the stuck seeds for 300
steps, each process on one core:

  taskset -c 0 python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg_plateau.py \
      --workdir runs/sweeps/gutenberg_plateau --set=total_steps=300 --set=log_every=25 \
      --only=centred-n1024-s1,fairseq-n1024-s1

Recipes (`RECIPES`), each naming its E in full so that it stays the same
whatever the defaults: `jl` the paper's E drawn N(0, 1/k) and trained as
every other weight; `centred` the same with the slot-common component removed
from every update of E and F (`projection_remove_common_update`); `local` E
starting as the mean of its n / k adjacent tokens (the windows of
projection='mean'); `local-centred` both, the default E since
docs/results_gutenberg.md, and with E's learning rate x 0.1
(`local-centred-slow`), pre-LN (`local-centred-preln`), a warm-up of 25 or
200 steps instead of 100 (`local-centred-warm25`, `local-centred-warm200`,
today's default) or a peak learning rate of 4e-3 or 1e-3 instead of 2e-3
(`local-centred-lr4`, `local-centred-lr1`); `fairseq` E drawn Glorot uniform
with gain 1/sqrt(2), whose slots keep a row's norm at every n, and
`fairseq-centred`; `xavier` Glorot with gain 1; `preln` pre-LN; and the
references, fixed `mean` slots and the Transformer (also with the 200-step
warm-up, `mean-warm200` and `transformer-warm200`); `default-k32` and `default-k128` are today's
default at k = 32 and 128. Every recipe but the warm-up ones trains
with the 100-step warm-up it was measured with. Every n takes 8,192 tokens
per step, as configs/sweeps/gutenberg_seq_len.py.

The table of a recipe runs the whole 500 steps of configs/gutenberg.py, at
every n and seed asked for, e.g. on two cores:

  taskset -c 1 python -m linformer_jax.sweep --sweep configs/sweeps/gutenberg_plateau.py \
      --workdir runs/sweeps/gutenberg_plateau_500 --set=log_every=25 \
      --only=local-centred-n256-s0,local-centred-n256-s1,local-centred-n256-s2

Each writes results.md (with the perplexity at every evaluation and the step
where each run left the plateau) and perplexity.png: the tables of
docs/results_gutenberg.md.
"""

from configs import gutenberg
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

TOKENS_PER_BATCH = 8192  # configs/gutenberg.py: batch 32 of n = 256
LENGTHS = (256, 512, 1024)  # n
SEEDS = (0, 1, 2, 3, 4)  # seeds per recipe and n

# Recipe -> its overrides of configs/gutenberg.py.
RECIPES = {
    'jl': {'model.projection_init': 'jl', 'projection_remove_common_update': False},
    'centred': {'model.projection_init': 'jl', 'projection_remove_common_update': True},
    'local-centred': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
    },
    'local-centred-slow': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'projection_learning_rate_scale': 0.1,
    },
    'local-centred-preln': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'model.pre_layer_norm': True,
    },
    'local-centred-warm25': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'warmup_steps': 25,
    },
    'local-centred-lr4': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'learning_rate': 4e-3,
    },
    'local-centred-warm200': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'warmup_steps': 200,
    },
    'local-centred-lr1': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'learning_rate': 1e-3,
    },
    'local': {'model.projection_init': 'local', 'projection_remove_common_update': False},
    'fairseq': {'model.projection_init': 'fairseq', 'projection_remove_common_update': False},
    'fairseq-centred': {
        'model.projection_init': 'fairseq',
        'projection_remove_common_update': True,
    },
    'xavier': {'model.projection_init': 'xavier', 'projection_remove_common_update': False},
    'preln': {
        'model.projection_init': 'jl',
        'projection_remove_common_update': False,
        'model.pre_layer_norm': True,
    },
    'mean': {'model.projection': 'mean'},
    'transformer': {'model.attention': 'full'},
    'transformer-warm200': {'model.attention': 'full', 'warmup_steps': 200},
    'mean-warm200': {'model.projection': 'mean', 'warmup_steps': 200},
    # Figure 3(a-b) with today's default: k = 32 and 128 (against the Transformer above).
    'default-k32': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'warmup_steps': 200,
        'model.projected_len': 32,
    },
    'default-k128': {
        'model.projection_init': 'local',
        'projection_remove_common_update': True,
        'warmup_steps': 200,
        'model.projected_len': 128,
    },
}


def _variant(recipe: str, n: int, seed: int) -> Variant:
  batch_size = TOKENS_PER_BATCH // n
  return Variant(
      f'{recipe}-n{n}-s{seed}',
      {
          **RECIPES[recipe],
          'model.max_len': n,
          'batch_size': batch_size,
          'eval_batch_size': batch_size,
          'seed': seed,
      },
  )


def get_sweep() -> Sweep:
  base = gutenberg.get_config()
  base.data.path = '../shared/data/gutenberg'  # the books, relative to the repository root
  base.model.projected_len = 64  # k, fixed across the sweep
  # The warm-up every recipe was measured with but the warm-up recipes; the default is
  # 200 steps since, which `local-centred-warm200` is.
  base.warmup_steps = 100
  return Sweep(
      title='Leaving the unigram plateau by recipe, n and seed (k = 64, 8,192 tokens per step)',
      base=base,
      variants=[_variant(recipe, n, seed) for recipe in RECIPES for n in LENGTHS for seed in SEEDS],
  )
