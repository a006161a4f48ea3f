"""The train state, the task losses and the jitted step functions; the
optimizer they step with comes from `optimization`.

Step functions are module-level and take every input explicitly (model,
optimizer and accumulation count are bound with functools.partial before
jitting), so each compiles once per run.
"""

import functools
from typing import Any, Callable, Dict, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Array = jax.Array
Batch = Dict[str, Array]


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint must hold to continue training exactly.

  Attributes:
    step: optimizer steps taken so far (int32 scalar).
    params: the trainable parameters.
    opt_state: the optimizer's state.
    constants: non-trainable model variables (fixed random projections).
  """

  step: Array
  params: Any
  opt_state: Any
  constants: Any

  def variables(self) -> Dict[str, Any]:
    return {'params': self.params, **self.constants}


def init_train_state(
    rng: Array, *, model: nn.Module, optimizer: optax.GradientTransformation, seq_len: int
) -> TrainState:
  """Initialises parameters, constants and optimizer state (jit this)."""
  variables = nn.meta.unbox(model.init(rng, jnp.ones((1, seq_len), jnp.int32)))
  params = variables.pop('params')
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
      constants=variables,
  )


def masked_lm_sums(logits: Array, batch: Batch) -> Dict[str, Array]:
  """Sums of cross-entropy, correct predictions and weights at masked tokens."""
  return _weighted_sums(logits, batch['targets'], batch['weights'])


def _weighted_sums(logits: Array, labels: Array, weights: Array) -> Dict[str, Array]:
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return {
      'loss_sum': jnp.sum(cross_entropy * weights),
      'correct_sum': jnp.sum(correct * weights),
      'weight_sum': jnp.sum(weights),
  }


def gather_predictions(batch: Batch, num_predictions: int) -> Tuple[Array, Batch]:
  """The positions of the masked tokens and the batch's targets/weights there.

  Returns `positions` [batch, num_predictions] (every position with a non-zero
  weight, then zero-weight fillers) and a batch whose `targets` and `weights`
  are taken at those positions. `num_predictions` must be at least the number
  of masked tokens of any row (`masked_lm.max_predictions`).
  """
  weights = batch['weights']
  num_predictions = min(num_predictions, weights.shape[1])
  _, positions = jax.lax.top_k(weights, num_predictions)
  take = lambda x: jnp.take_along_axis(x, positions, axis=1)
  return positions, {**batch, 'targets': take(batch['targets']), 'weights': take(weights)}


# A task's loss: (variables, batch, deterministic, rngs) -> the sums
# loss_sum, correct_sum and weight_sum of the batch.
LossSums = Callable[..., Dict[str, Array]]


def masked_lm_loss(model: nn.Module, num_predictions: int) -> LossSums:
  """Cross-entropy at the masked tokens of `inputs` (batch: inputs, targets,
  weights, padding_mask, each [batch, length]).

  `num_predictions` is the most masked tokens a row can hold; logits are only
  computed there (`gather_predictions`).
  """

  def sums(variables, batch: Batch, *, deterministic: bool, rngs=None):
    positions, batch = gather_predictions(batch, num_predictions)
    logits = model.apply(
        variables,
        batch['inputs'],
        batch['padding_mask'],
        deterministic=deterministic,
        rngs=rngs,
        positions=positions,
    )
    return masked_lm_sums(logits, batch)

  return sums


def next_token_loss(model: nn.Module) -> LossSums:
  """Cross-entropy of every next token (batch: inputs, targets, weights and
  padding_mask, each [batch, length]; targets[t] is the token after t, and
  weights are 0 where there is none)."""

  def sums(variables, batch: Batch, *, deterministic: bool, rngs=None):
    logits = model.apply(
        variables, batch['inputs'], batch['padding_mask'], deterministic=deterministic, rngs=rngs
    )
    return _weighted_sums(logits, batch['targets'], batch['weights'])

  return sums


def classification_loss(model: nn.Module) -> LossSums:
  """Cross-entropy of one label per sequence (batch: inputs, padding_mask and
  segments [batch, length]; labels and weights [batch], weight 0 for filler
  rows)."""

  def sums(variables, batch: Batch, *, deterministic: bool, rngs=None):
    logits = model.apply(
        variables,
        batch['inputs'],
        batch['padding_mask'],
        segments=batch['segments'],
        deterministic=deterministic,
        rngs=rngs,
    )
    return _weighted_sums(logits, batch['labels'], batch['weights'])

  return sums


def all_finite(tree: Any) -> Array:
  """A boolean scalar: every element of every floating-point array in `tree`
  is finite (integer leaves, such as an optimizer's step count, always are)."""
  leaves = [
      leaf
      for leaf in jax.tree_util.tree_leaves(tree)
      if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
  ]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves] or [jnp.bool_(True)]))


def _microbatches(batch: Batch, count: int) -> Batch:
  return jax.tree_util.tree_map(
      lambda x: x.reshape((count, x.shape[0] // count) + x.shape[1:]), batch
  )


def train_step(
    state: TrainState,
    batch: Batch,
    dropout_key: Array,
    *,
    loss_sums: LossSums,
    optimizer: optax.GradientTransformation,
    grad_accum_steps: int = 1,
    compute_shardings: Any = None,
) -> Tuple[TrainState, Dict[str, Array]]:
  """One optimizer step on a batch, optionally over several micro-batches.

  The loss is the mean cross-entropy over every weighted prediction of the
  whole batch (masked tokens, or sequences), so accumulating micro-batches
  gives the same gradient as one big batch.

  Args:
    state: the train state (donated by the caller's jit).
    batch: the task's arrays (see `masked_lm_loss`, `classification_loss`),
      batch divisible by grad_accum_steps.
    dropout_key: the run's dropout key; folded with the step, so a resumed run
      draws the same dropout masks.
    loss_sums, optimizer, grad_accum_steps: bound with functools.partial.
    compute_shardings: the parameters' shardings for the forward and backward
      passes where they differ from the state's (FSDP: gathered from their
      'data' shards, which left to itself XLA may instead spread the
      activations over); None = the state's.

  Returns:
    The new state and metrics: loss, accuracy, grad_norm, and `finite`, True
    when the loss and every new parameter and optimizer moment are finite.
    When it is False the step was skipped: the returned state holds the old
    parameters and optimizer state (only `step` moved on), so the state is
    always safe to save and the loop need not fetch anything to know it.
  """
  total_weight = jnp.maximum(jnp.sum(batch['weights']), 1.0)
  step_key = jax.random.fold_in(dropout_key, state.step)

  def loss_fn(params, micro_batch, key):
    if compute_shardings is not None:
      params = jax.lax.with_sharding_constraint(params, compute_shardings)
    sums = loss_sums(
        {'params': params, **state.constants},
        micro_batch,
        deterministic=False,
        rngs={'dropout': key},
    )
    return sums['loss_sum'] / total_weight, sums

  grad_fn = jax.grad(loss_fn, has_aux=True)

  def accumulate(carry, inputs):
    grads, sums = carry
    micro_batch, index = inputs
    micro_grads, micro_sums = grad_fn(
        state.params, micro_batch, jax.random.fold_in(step_key, index)
    )
    return (
        jax.tree_util.tree_map(jnp.add, grads, micro_grads),
        jax.tree_util.tree_map(jnp.add, sums, micro_sums),
    ), None

  zero_grads = jax.tree_util.tree_map(jnp.zeros_like, state.params)
  zero_sums = {'loss_sum': 0.0, 'correct_sum': 0.0, 'weight_sum': 0.0}
  zero_sums = jax.tree_util.tree_map(jnp.float32, zero_sums)
  (grads, sums), _ = jax.lax.scan(
      accumulate,
      (zero_grads, zero_sums),
      (_microbatches(batch, grad_accum_steps), jnp.arange(grad_accum_steps)),
  )

  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  loss = sums['loss_sum'] / total_weight
  finite = jnp.isfinite(loss) & all_finite(params) & all_finite(opt_state)
  # A non-finite step is skipped, as optax.apply_if_finite does, but the
  # parameters are checked too (an update can overflow a finite weight): the
  # step count moves on, the parameters and optimizer state stay as they were.
  keep_if_finite = lambda new, old: jnp.where(finite, new, old)
  new_state = state.replace(
      step=state.step + 1,
      params=jax.tree_util.tree_map(keep_if_finite, params, state.params),
      opt_state=jax.tree_util.tree_map(keep_if_finite, opt_state, state.opt_state),
  )
  metrics = {
      'loss': loss,
      'accuracy': sums['correct_sum'] / total_weight,
      'grad_norm': optax.tree.norm(grads),
      'finite': finite,
  }
  return new_state, metrics


def eval_step(
    variables: Dict[str, Any], batch: Batch, *, loss_sums: LossSums, compute_shardings: Any = None
) -> Dict[str, Array]:
  """The loss sums of one evaluation batch (no dropout); `compute_shardings`
  as in `train_step`."""
  if compute_shardings is not None:
    params = jax.lax.with_sharding_constraint(variables['params'], compute_shardings)
    variables = {**variables, 'params': params}
  return loss_sums(variables, batch, deterministic=True)


def _replicated_like(sharding: jax.sharding.NamedSharding) -> jax.sharding.NamedSharding:
  return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())


def jit_train_step(
    loss_sums: LossSums,
    optimizer: optax.GradientTransformation,
    grad_accum_steps: int,
    *,
    state_shardings: Any,
    batch_sharding: jax.sharding.NamedSharding,
    compute_shardings: Any = None,
):
  """The jitted train step of a task, state donated.

  It takes and returns the state split over the mesh as `state_shardings` (a
  TrainState of shardings) and batches as `batch_sharding`; the dropout key
  and the metrics are replicated. `compute_shardings`: see `train_step`.
  """
  replicated = _replicated_like(batch_sharding)
  return jax.jit(
      functools.partial(
          train_step,
          loss_sums=loss_sums,
          optimizer=optimizer,
          grad_accum_steps=grad_accum_steps,
          compute_shardings=compute_shardings,
      ),
      donate_argnums=0,
      in_shardings=(state_shardings, batch_sharding, replicated),
      out_shardings=(state_shardings, replicated),
  )


def jit_eval_step(
    loss_sums: LossSums,
    *,
    variable_shardings: Any,
    batch_sharding: jax.sharding.NamedSharding,
    compute_shardings: Any = None,
):
  """The jitted eval step of a task: (variables, batch) -> replicated loss sums."""
  return jax.jit(
      functools.partial(eval_step, loss_sums=loss_sums, compute_shardings=compute_shardings),
      in_shardings=(variable_shardings, batch_sharding),
      out_shardings=_replicated_like(batch_sharding),
  )
