"""A sweep over parts of your own: the built-in 'linear' projection against the
learned convex one with the tempered attention, at a setting that kind declares.

  python -m linformer_jax.sweep --sweep docs/examples/convex_sweep.py \
      --workdir /tmp/convex_sweep

configs/tiny.py's model, trained 8 steps per row (seconds each on a CPU): a
check that the parts train side by side, not a comparison worth reading. For
one, start from configs/default.py and its budget. Each variant names the
files that register its parts in `extensions`; the sweep imports them before
it checks any variant, so a variant may set what their kinds declare
(`model.temperature_init`). Writes /tmp/convex_sweep/results.md and
perplexity.png.
"""

from configs import tiny
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant

CONVEX = 'docs/examples/convex_projection.py'
TEMPERED = 'docs/examples/tempered_attention.py'


def get_sweep() -> Sweep:
  base = tiny.get_config()
  base.total_steps = 8  # steps per variant
  base.warmup_steps = 2  # linear warm-up steps of the learning rate
  base.eval_every = 8  # one validation at the end
  base.checkpoint_every = 8  # one checkpoint at the end
  return Sweep(
      title='A projection of your own (tiny)',  # heading of results.md and the figure
      base=base,  # the Linformer with the built-in learned E ('linear')
      variants=[
          Variant('linear', {}),  # the built-in learned matrix
          Variant(
              'convex-tempered',  # and a learned temperature per head, starting at 2
              {
                  'extensions': (CONVEX, TEMPERED),
                  'model.projection': 'convex',
                  'model.attention': 'tempered_linformer',
                  'model.temperature_init': 2.0,
              },
          ),
      ],
  )
