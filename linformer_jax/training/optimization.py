"""The optimizer: AdamW with its learning-rate schedule, and what it does to
the sequence projections' updates.

`create_optimizer` builds AdamW (RoBERTa's betas and eps, weight decay on
matrices only, global-norm clipping) on `learning_rate_schedule`'s warm-up and
linear decay. Two settings change only the updates of the learned E/F
matrices: `scale_projection_updates` multiplies them
(`projection_learning_rate_scale`), and `remove_common_projection_updates`
takes out the component every slot shares (`projection_remove_common_update`).
Both keep the wrapped optimizer's state, so a run may resume with either
setting changed.
"""

from typing import Any, Tuple

import jax
import jax.numpy as jnp
import optax

from linformer_jax.model.layers import PROJECTION_NAMES
from linformer_jax.training.run_config import OptimizerSettings

Array = jax.Array


def learning_rate_schedule(config: OptimizerSettings) -> optax.Schedule:
  """Linear warm-up to the peak rate, then linear decay to end_learning_rate."""
  warmup = optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
  decay = optax.linear_schedule(
      config.learning_rate,
      config.end_learning_rate,
      max(config.total_steps - config.warmup_steps, 1),
  )
  return optax.join_schedules([warmup, decay], [config.warmup_steps])


def _decay_mask(params):
  """Weight decay on matrices only: not on biases, norms or scalars (RoBERTa)."""
  return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


def create_optimizer(config: OptimizerSettings) -> optax.GradientTransformation:
  """AdamW with RoBERTa's betas/eps, global-norm clipping and the LR schedule;
  the sequence projections' updates scaled by projection_learning_rate_scale."""
  adamw = optax.adamw(
      learning_rate_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=_decay_mask,
  )
  optimizer = adamw
  if config.grad_clip_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adamw)
  if config.projection_learning_rate_scale != 1.0:
    optimizer = scale_projection_updates(optimizer, config.projection_learning_rate_scale)
  if config.projection_remove_common_update and config.projection == 'linear':
    optimizer = remove_common_projection_updates(optimizer)
  return optimizer


def remove_slot_common_component(update: Array) -> Array:
  """An update of a [(heads,) n, k] matrix less its mean over the k slots.

  That mean, one value per position (and head), is the vector every slot of
  E would move by alike: all that Adam writes into E while attention is
  uniform (docs/results_gutenberg.md). What is left sums to zero over the
  slots of every row.
  """
  return update - jnp.mean(update, axis=-1, keepdims=True)


def remove_common_projection_updates(
    optimizer: optax.GradientTransformation,
) -> optax.GradientTransformation:
  """`optimizer` with the slot-common component removed from its updates of the
  learned E/F matrices (`remove_slot_common_component`), after Adam, the
  learning rate and weight decay. The state is `optimizer`'s own, so a run may
  resume with the setting changed."""

  def update(updates, state, params=None):
    updates, state = optimizer.update(updates, state, params)
    updates = jax.tree_util.tree_map_with_path(
        lambda path, u: remove_slot_common_component(u) if is_projection_weight(path) else u,
        updates,
    )
    return updates, state

  return optax.GradientTransformation(optimizer.init, update)


def is_projection_weight(path: Tuple[Any, ...]) -> bool:
  """Whether a parameter's tree path names a sequence projection's weight (E/F)."""
  return any(getattr(key, 'key', None) in PROJECTION_NAMES for key in path)


def scale_projection_updates(
    optimizer: optax.GradientTransformation, scale: float
) -> optax.GradientTransformation:
  """`optimizer` with its updates of the sequence projections' weights (learned
  E/F, conv kernels) multiplied by `scale`: their learning rate and decoupled
  weight decay times `scale`, 0 freezing them. The state is `optimizer`'s own,
  so a run may resume with another scale.

  Adam moves every entry by about the learning rate whatever its gradient's
  size, so a small but steady gradient (on the unigram plateau every slot of E
  gets the same one) moves E as far as any weight: this is the knob that slows
  it (docs/results_parity.md).
  """

  def update(updates, state, params=None):
    updates, state = optimizer.update(updates, state, params)
    updates = jax.tree_util.tree_map_with_path(
        lambda path, u: u * scale if is_projection_weight(path) else u, updates
    )
    return updates, state

  return optax.GradientTransformation(optimizer.init, update)
