"""The training loop: MLM pretraining or classification, evaluation, checkpoints.

`config.task` is 'masked_lm' (pretraining, `input_pipeline`) or
'classification' (fine-tuning from `config.init_from`'s encoder, or training
from scratch as in the Long Range Arena; `classification_data`).
`train_and_evaluate(config, workdir)` runs a whole job and resumes by itself
from the newest checkpoint in `workdir/checkpoints`. Checkpoints hold the
parameters, the optimizer state, the data iterator's position and the config,
and the dropout keys derive from the seed and the step, so a resumed run takes
exactly the steps an uninterrupted one would have. SIGTERM saves a checkpoint
before the program exits; a non-finite loss stops the run before the bad state
is saved.
"""

import json
import math
import os
import signal
import time
from typing import Any, Dict, Iterable, List, Optional

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from linformer_jax.data import classification as classification_data
from linformer_jax.training import fine_tuning
from linformer_jax.data import masked_lm
from linformer_jax.model import models
from linformer_jax.training import run_config
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.training import train_steps
from linformer_jax.training.checkpoints import CheckpointStore
from linformer_jax.training.checkpoints import checkpoint_directory
from linformer_jax.errors import ConfigError
from linformer_jax.training.metric_writers import MetricLogger

RESULTS_FILE = 'eval_results.json'
class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or infinite."""


class _TerminationRequest:
  """Turns SIGTERM into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def report(message: str) -> None:
  """Logs a message and prints it on the primary process."""
  logging.info(message)
  if jax.process_index() == 0:
    print(message, flush=True)


def abstract_train_state(model, optimizer, seq_len: int, mesh, rules
                         ) -> train_steps.TrainState:
  """The train state as `jax.ShapeDtypeStruct`s carrying their shardings on `mesh`.

  Parameters and constants follow their logical axis names through `rules`;
  optimizer moments follow their parameters; the step is replicated. It is
  what `train_steps.init_train_state` returns, without computing anything.
  """
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                         jnp.ones((1, seq_len), jnp.int32))
  constant_shardings = sharding_lib.parameter_shardings(boxed, mesh, rules)
  param_shardings = constant_shardings.pop('params')
  constants = nn.meta.unbox(boxed)
  params = constants.pop('params')
  opt_state = jax.eval_shape(optimizer.init, params)
  shapes = train_steps.TrainState(
      step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
      opt_state=opt_state, constants=constants)
  shardings = train_steps.TrainState(
      step=sharding_lib.replicated(mesh), params=param_shardings,
      opt_state=sharding_lib.like_parameters(opt_state, params, param_shardings,
                                             mesh),
      constants=constant_shardings)
  return jax.tree_util.tree_map(
      lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      shapes, shardings)


def shardings_of(abstract_state: train_steps.TrainState) -> train_steps.TrainState:
  return jax.tree_util.tree_map(lambda x: x.sharding, abstract_state)


def evaluate_batches(eval_step, state, batches: Iterable[Dict[str, np.ndarray]],
                     to_device=lambda batch: batch,
                     task: str = 'masked_lm') -> Dict[str, float]:
  """Loss and accuracy over all evaluation batches; for masked_lm also the
  perplexity and the number of masked tokens, else the number of examples."""
  totals = {'loss_sum': 0.0, 'correct_sum': 0.0, 'weight_sum': 0.0}
  for batch in batches:
    sums = jax.device_get(eval_step(state, to_device(batch)))
    for key in totals:
      totals[key] += float(sums[key])
  weight = max(totals['weight_sum'], 1.0)
  loss = totals['loss_sum'] / weight
  metrics = {'loss': loss, 'accuracy': totals['correct_sum'] / weight}
  if task == 'classification':
    return {**metrics, 'examples': totals['weight_sum']}
  return {**metrics, 'perplexity': math.exp(min(loss, 700.0)),
          'masked_tokens': totals['weight_sum']}


def majority_accuracy(train_label_counts: np.ndarray,
                      batches: Iterable[Dict[str, np.ndarray]]) -> float:
  """Accuracy of always predicting the training split's most common class."""
  majority = int(np.argmax(train_label_counts))
  correct, weight = 0.0, 0.0
  for batch in batches:
    correct += float(np.sum((batch['labels'] == majority) * batch['weights']))
    weight += float(np.sum(batch['weights']))
  return correct / max(weight, 1.0)


def reference_results(task: str, data) -> Dict[str, float]:
  """The trivial model a run must beat, scored on its evaluation batches."""
  if task == 'classification':
    return {'majority_class_accuracy': majority_accuracy(data.train_label_counts,
                                                         data.eval_batches)}
  return {'unigram_perplexity': unigram_perplexity(data.train_token_counts,
                                                   data.eval_batches)}


def describe_metrics(task: str, split: str, metrics: Dict[str, float]) -> str:
  """One line of evaluation results, e.g. for the progress report."""
  if task == 'classification':
    return f'{split} loss {metrics["loss"]:.4f}, accuracy {metrics["accuracy"]:.4f}'
  return (f'{split} loss {metrics["loss"]:.4f}, perplexity '
          f'{metrics["perplexity"]:.2f}, accuracy {metrics["accuracy"]:.4f}')


def unigram_perplexity(train_token_counts: np.ndarray,
                       batches: Iterable[Dict[str, np.ndarray]]) -> float:
  """Perplexity at the masked tokens of a unigram model of the training split.

  The reference a masked-LM must beat: it predicts every masked token from its
  training-set frequency alone (add-one smoothed).
  """
  probabilities = (train_token_counts + 1.0) / (train_token_counts.sum()
                                                + len(train_token_counts))
  log_prob, weight = 0.0, 0.0
  for batch in batches:
    log_prob += float(np.sum(np.log(probabilities[batch['targets']]) * batch['weights']))
    weight += float(np.sum(batch['weights']))
  return math.exp(-log_prob / max(weight, 1.0))


def _prefixed(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
  return {f'{prefix}_{name}': value for name, value in metrics.items()}


def _build_datasets_in_turn(config, workdir: str):
  """This process's data; process 0 goes first and trains the tokenizer.

  The other processes wait for it, then load the tokenizer it saved in the
  workdir, so that all of them use the same token ids.
  """
  module = (classification_data if config.task == 'classification'
            else masked_lm)
  build = lambda: module.build_datasets(
      config, workdir, process_index=jax.process_index(),
      process_count=jax.process_count())
  if jax.process_count() == 1:
    return build()
  data = build() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices('linformer_jax: tokenizer and data cache ready')
  return data if data is not None else build()


def _gather_bytes(data: bytes) -> List[bytes]:
  """Every process's `data`, in process order (a collective: all must call)."""
  if jax.process_count() == 1:
    return [data]
  lengths = multihost_utils.process_allgather(np.array([len(data)], np.int32))
  padded = np.zeros([int(lengths.max())], np.uint8)
  padded[:len(data)] = np.frombuffer(data, np.uint8)
  gathered = multihost_utils.process_allgather(padded)
  return [bytes(gathered[i, :int(lengths[i, 0])]) for i in range(jax.process_count())]


def _this_process_state(data_state: Dict[str, Any]) -> bytes:
  """This process's data-iterator state from a checkpoint's data state."""
  states = data_state['process_states']
  if len(states) != jax.process_count():
    raise ConfigError(
        f'The checkpoint was written by {len(states)} processes, each reading its '
        f'own shard of the data; resume it with {len(states)} processes (the mesh '
        f'may differ), not {jax.process_count()}.')
  return states[jax.process_index()].encode('latin-1')


class Run:
  """One training run: data, model, step functions, state and checkpoints."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config = config
    self.workdir = workdir
    model_config = run_config.validate(config)
    self.mesh = sharding_lib.create_mesh(config.mesh_shape)
    rules = sharding_lib.axis_rules(config)
    sharding_lib.check_divisibility(model_config, self.mesh, rules,
                                    batch_size=config.batch_size,
                                    eval_batch_size=config.eval_batch_size)
    self.batch_sharding = sharding_lib.batch_sharding(self.mesh, rules)
    self.store = CheckpointStore(checkpoint_directory(workdir),
                                 keep=config.keep_checkpoints)
    if self.store.latest_step() is not None:
      run_config.check_same_model(self.store.restore_config(), config, workdir)
    self.pretrained_model = None  # the init_from run's model config, when fine-tuning
    if (config.init_from and config.task == 'classification'
        and self.store.latest_step() is None):
      self.pretrained_model = fine_tuning.check_pretrained_encoder(config)
    self.data = _build_datasets_in_turn(config, workdir)
    # build_datasets has checked model.vocab_size against the tokenizer.
    if config.task == 'classification':
      self.model = models.SequenceClassifier(
          model_config, classification_data.num_classes(config))
      loss_sums = train_steps.classification_loss(self.model)
    else:
      self.model = models.MaskedLanguageModel(model_config)
      loss_sums = train_steps.masked_lm_loss(
          self.model, masked_lm.max_predictions(model_config.max_len,
                                                     config.data.mask_rate))
    self.optimizer = train_steps.create_optimizer(config)
    self.schedule = train_steps.learning_rate_schedule(config)
    self.abstract_state = abstract_train_state(
        self.model, self.optimizer, model_config.max_len, self.mesh, rules)
    self.state_shardings = shardings_of(self.abstract_state)
    self.train_step, self.eval_step = train_steps.jit_step_functions(
        loss_sums, self.optimizer, config.grad_accum_steps,
        state_shardings=self.state_shardings, batch_sharding=self.batch_sharding)
    self.state = self._initial_state(model_config.max_len)

  def device_batch(self, local_batch: Dict[str, np.ndarray]) -> Dict[str, jax.Array]:
    """This process's rows of a batch as global arrays split over the mesh."""
    return sharding_lib.global_batch(local_batch, self.batch_sharding)

  def _initial_state(self, seq_len: int) -> train_steps.TrainState:
    latest = self.store.latest_step()
    if latest is not None:
      step, state, data_state, _ = self.store.restore(
          latest, abstract_state=self.abstract_state)
      self.data.train_iterator.set_state(_this_process_state(data_state))
      report(f'Resumed from the checkpoint of step {step} in {self.workdir}.')
      return state
    # Created already split over the mesh: no device ever holds all of it.
    init = jax.jit(lambda rng: train_steps.init_train_state(
        rng, model=self.model, optimizer=self.optimizer, seq_len=seq_len),
                   out_shardings=self.state_shardings)
    state = init(jax.random.PRNGKey(self.config.seed))
    if self.config.init_from and self.config.task == 'classification':
      state, fresh = fine_tuning.with_pretrained_encoder(
          state, self.abstract_state, self.config.init_from, self.pretrained_model)
      new = f' ({", ".join(fresh)} start at zero)' if fresh else ''
      report(f'Initialised the encoder from {self.config.init_from}{new}; the '
             'classification head is new.')
    elif self.config.init_from:
      params = self.store.restore_params(self.config.init_from,
                                         self.abstract_state.params)
      state = state.replace(params=params)
      report(f'Initialised parameters from {self.config.init_from}.')
    return state

  def save(self, force: bool = False) -> None:
    # Every process reads its own shard, so the checkpoint keeps every
    # process's iterator position (orbax writes JSON from process 0 only).
    states = _gather_bytes(self.data.train_iterator.get_state())
    data_state = {'process_states': [state.decode('latin-1') for state in states]}
    self.store.save(int(self.state.step), state=self.state, data_state=data_state,
                    config=self.config.to_dict(), force=force)

  def evaluate(self) -> Dict[str, float]:
    return evaluate_batches(self.eval_step, self.state, self.data.eval_batches,
                            self.device_batch, task=self.config.task)


def _write_json(path: str, payload: Dict[str, Any]) -> None:
  if jax.process_index() == 0:
    with open(path, 'w') as f:
      json.dump(payload, f, indent=2, sort_keys=True)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after: Optional[int] = None) -> Optional[Dict[str, Any]]:
  """Trains to config.total_steps (resuming if possible) and evaluates.

  Args:
    config: the run's config.
    workdir: the run's directory; an existing run there is resumed.
    stop_after: if set, stop with a checkpoint once the run has taken this
      many steps (a budget for now; the run stays resumable to total_steps).

  Returns:
    The final results, also written to workdir/eval_results.json, or None when
    stopped early by stop_after.

  Raises:
    ConfigError: bad config, data or workdir; nothing in the workdir is changed.
    NonFiniteLossError: the loss became NaN/inf; the last good checkpoint stays.
  """
  start_time = time.time()
  run = Run(config, workdir)
  os.makedirs(workdir, exist_ok=True)
  _write_json(os.path.join(workdir, 'config.json'), config.to_dict())
  first_step = int(run.state.step)
  parameter_count = int(sum(x.size for x in jax.tree_util.tree_leaves(run.state.params)))
  report(f'{config.model.attention} model, {parameter_count:,} parameters; '
         f'{run.data.train_sequences:,} training and {run.data.eval_sequences:,} '
         f'{config.data.eval_split} sequences of {config.model.max_len} tokens; '
         f'training steps {first_step + 1}..{config.total_steps}.')
  logger = MetricLogger(workdir, total_steps=config.total_steps,
                        is_primary=jax.process_index() == 0)
  logger.discard_after(first_step)
  tokens_per_step = config.batch_size * config.model.max_len
  dropout_key = jax.random.fold_in(jax.random.PRNGKey(config.seed), 1)
  termination = _TerminationRequest()
  eval_metrics: Optional[Dict[str, float]] = None
  try:
    for step in range(first_step + 1, config.total_steps + 1):
      batch = run.device_batch(next(run.data.train_iterator))
      run.state, metrics = run.train_step(run.state, batch, dropout_key)
      loss = float(metrics['loss'])
      if not math.isfinite(loss):
        raise NonFiniteLossError(
            f'The training loss is {loss} at step {step}; stopping. The last good '
            f'checkpoint stays in {checkpoint_directory(workdir)}. Lower '
            'config.learning_rate or raise config.warmup_steps, then resume.')
      if step % config.log_every == 0 or step == config.total_steps:
        scalars = {name: float(value) for name, value in metrics.items()}
        scalars['learning_rate'] = float(run.schedule(step - 1))
        scalars.update(logger.progress(step, tokens_per_step=tokens_per_step,
                                       loss=loss))
        logger.write_scalars(step, _prefixed('train', scalars))
      if step % config.eval_every == 0 or step == config.total_steps:
        eval_metrics = run.evaluate()
        logger.write_scalars(step, _prefixed('eval', eval_metrics))
        report(f'step {step}: ' + describe_metrics(config.task, config.data.eval_split,
                                                   eval_metrics))
      if step % config.checkpoint_every == 0 or step == config.total_steps:
        run.save()
      if stop_after is not None and step >= stop_after and step < config.total_steps:
        run.save(force=True)
        return None
      if termination.requested:
        logging.warning('SIGTERM received: saving the checkpoint of step %d.', step)
        run.save(force=True)
        run.store.wait()
        raise SystemExit(128 + signal.SIGTERM)
  finally:
    termination.restore()
    run.store.wait()
    logger.close()
  if eval_metrics is None:
    eval_metrics = run.evaluate()
  results = {
      'step': int(run.state.step),
      'eval_split': config.data.eval_split,
      'task': config.task,
      **_prefixed('eval', eval_metrics),
      **reference_results(config.task, run.data),
      'parameters': parameter_count,
      'wall_time_s': time.time() - start_time,
  }
  _write_json(os.path.join(workdir, RESULTS_FILE), results)
  run.store.close()
  return results


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        split: str) -> Dict[str, Any]:
  """Evaluates the newest checkpoint of a run on a split; writes JSON."""
  if CheckpointStore(checkpoint_directory(workdir)).latest_step() is None:
    raise ConfigError(f'{workdir} holds no checkpoint; train first or fix --workdir.')
  config = ml_collections.ConfigDict(config.to_dict())
  config.data.eval_split = split
  run = Run(config, workdir)
  metrics = run.evaluate()
  results = {'step': int(run.state.step), 'split': split, 'task': config.task,
             **metrics, **reference_results(config.task, run.data)}
  _write_json(os.path.join(workdir, f'eval_{split}.json'), results)
  run.store.close()
  return results
