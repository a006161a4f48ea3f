"""The optimizer: AdamW with its learning-rate schedule, and what it does to
the updates of the sequence projections and of an attention kind's own
parameters.

`create_optimizer` builds AdamW (RoBERTa's betas and eps, weight decay on
matrices only, global-norm clipping) on `learning_rate_schedule`'s warm-up and
linear decay. Two settings change only the updates of the learned E/F
matrices: `projection_learning_rate_scale` multiplies them (`scale_updates`),
and `remove_common_projection_updates` takes out the component every slot
shares (`projection_remove_common_update`). An attention kind's own parameters
(`attention_kinds.Parameter`) declare their learning-rate scale, applied the
same way, and whether weight decay applies to them. All of these keep the
wrapped optimizer's state, so a run may resume with any of them changed.
"""

import math
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from linformer_jax.errors import ConfigError
from linformer_jax.model.layers import PROJECTION_NAMES
from linformer_jax.model.layers import SCANNED_LAYERS
from linformer_jax.training.run_config import OptimizerSettings

Array = jax.Array

# The name each encoder layer gives its attention (layers.EncoderLayer): an
# attention kind's own parameters sit right under it, by the names it declares.
ATTENTION_MODULE = 'attention'


def learning_rate_schedule(config: OptimizerSettings) -> optax.Schedule:
  """Linear warm-up to the peak rate, then linear decay to end_learning_rate."""
  warmup = optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
  decay = optax.linear_schedule(
      config.learning_rate,
      config.end_learning_rate,
      max(config.total_steps - config.warmup_steps, 1),
  )
  return optax.join_schedules([warmup, decay], [config.warmup_steps])


def _checked_attention_parameters(
    config: OptimizerSettings,
) -> Tuple[Dict[str, float], Dict[str, Optional[bool]]]:
  """The attention kind's parameters' learning-rate scales and weight decay
  rules, by name; a ConfigError for a value the optimizer cannot honour."""
  scales, decays = {}, {}
  for name, scale, decay in config.attention_parameters:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 <= scale < math.inf:
      raise ConfigError(
          f'The attention kind declares parameter {name!r} with learning_rate_scale={scale!r}: '
          'use a finite number >= 0 (1 = the learning rate of every other weight, 0 = frozen).'
      )
    if decay is not None and not isinstance(decay, bool):
      raise ConfigError(
          f'The attention kind declares parameter {name!r} with weight_decay={decay!r}: use '
          "True, False or None (the optimizer's rule: matrices only)."
      )
    scales[name], decays[name] = float(scale), decay
  return scales, decays


def attention_parameter_name(path: Tuple[Any, ...], names: Mapping[str, Any]) -> Optional[str]:
  """The name of the attention kind's parameter a tree path leads to (one of
  `names`, directly under a layer's attention), or None."""
  keys = [getattr(key, 'key', None) for key in path]
  if len(keys) >= 2 and keys[-2] == ATTENTION_MODULE and keys[-1] in names:
    return keys[-1]
  return None


def _decay_mask(decays: Mapping[str, Optional[bool]]) -> Callable[[Any], Any]:
  """Weight decay on matrices only: not on biases, norms or scalars (BERT's rule;
  fairseq's RoBERTa decays every parameter); an attention kind's parameter as
  it declares (`decays`, by name; None: the rule). A bias or a norm's scale
  is never decayed, whatever its shape (a query's bias is [heads, head_dim]);
  and a matrix is judged per layer: scanned layers' variables carry a leading
  axis of num_layers."""

  def decays_at(path, param) -> bool:
    name = attention_parameter_name(path, decays)
    if name is not None and decays[name] is not None:
      return decays[name]
    keys = [getattr(key, 'key', None) for key in path]
    if keys[-1] in ('bias', 'scale'):
      return False
    return param.ndim - (SCANNED_LAYERS in keys) > 1

  return lambda params: jax.tree_util.tree_map_with_path(decays_at, params)


def create_optimizer(config: OptimizerSettings) -> optax.GradientTransformation:
  """AdamW with RoBERTa's betas/eps, global-norm clipping and the LR schedule;
  the sequence projections' updates scaled by projection_learning_rate_scale,
  an attention kind's parameters' by their own scale, weight decay where
  `_decay_mask` says."""
  scales, decays = _checked_attention_parameters(config)
  adamw = optax.adamw(
      learning_rate_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=_decay_mask(decays),
  )
  optimizer = adamw
  if config.grad_clip_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adamw)
  if config.projection_learning_rate_scale != 1.0 or any(s != 1.0 for s in scales.values()):

    def scale_of(path) -> float:
      if is_projection_weight(path):
        return config.projection_learning_rate_scale
      name = attention_parameter_name(path, scales)
      return 1.0 if name is None else scales[name]

    optimizer = scale_updates(optimizer, scale_of)
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


def scale_updates(
    optimizer: optax.GradientTransformation, scale_of: Callable[[Tuple[Any, ...]], float]
) -> optax.GradientTransformation:
  """`optimizer` with its update of each parameter multiplied by `scale_of(path)`
  (its tree path): its learning rate and decoupled weight decay times the
  scale, 0 freezing it. The state is `optimizer`'s own, so a run may resume
  with other scales.

  For the sequence projections' weights (learned E/F, conv kernels) the scale
  is projection_learning_rate_scale: Adam moves every entry by about the
  learning rate whatever its gradient's size, so a small but steady gradient
  (on the unigram plateau every slot of E gets the same one) moves E as far as
  any weight, and this is the knob that slows it (docs/results_parity.md).
  """

  def update(updates, state, params=None):
    updates, state = optimizer.update(updates, state, params)
    updates = jax.tree_util.tree_map_with_path(lambda path, u: u * scale_of(path), updates)
    return updates, state

  return optax.GradientTransformation(optimizer.init, update)
