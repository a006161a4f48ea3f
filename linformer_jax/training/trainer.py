"""The training loop: any task's training, evaluation and checkpoints.

`train_and_evaluate(config, workdir)` runs a whole job and resumes by itself
from the newest checkpoint in `workdir/checkpoints`; what differs between
tasks (data, model head, loss, metrics) comes from the task object of
`config.task` (`tasks`), and the run's parts, state and checkpoints from
`training_run.TrainingRun`, built with `run_builder`. Checkpoints hold the
parameters, the optimizer state, the data iterator's position, the
tokenizer's fingerprint and the config, and the dropout keys derive from the
seed and the step, so a resumed run takes exactly the steps an uninterrupted
one would have. The run holds the workdir's lock, resumes from the newest
intact checkpoint (damaged ones are moved aside), and stops with one line
when a save fails on a full disk (`checkpoints`).

The loop never waits on the device between steps: a step whose loss or new
parameters are non-finite is skipped on the device (the state stays as it
was), and the flags and losses are fetched only when something is due (a log
line, an evaluation, a checkpoint, a stop). Then `divergence.DivergenceGuard`
protects a checkpoint from before a loss spike and stops a run whose bad
steps come in a row, so every checkpoint holds finite parameters;
every save records in WORKDIR/sound_steps.json whether the step is sound, so
that a re-run after a divergence never goes on from, or loses, the wrong
step; `config.restore_step` goes back to an older sound step. A run that ends
on a step that is not sound with a diverged model's loss (finite, but above
`divergence.DIVERGED_LOSS`) writes no results and stops with the divergence
error; one whose loss is a model's saves them with a warning. SIGTERM and
Ctrl-C save a checkpoint before the program exits (143, 130); with several
processes, SIGTERM to any
one of them makes all save the same step (JAX's preemption sync point).
"""

import contextlib
import math
import os
import signal
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from clu import parameter_overview
import jax
from jax.experimental import multihost_utils
import ml_collections

from linformer_jax import interrupts
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.training import compiled_step
from linformer_jax.training import divergence
from linformer_jax.training import loop_actions
from linformer_jax.training import run_builder
from linformer_jax.training import training_run
from linformer_jax.training import workdir_lock
from linformer_jax.training.divergence import NonFiniteLossError
from linformer_jax.training.metric_writers import MetricLogger
from linformer_jax.training.metric_writers import json_text
from linformer_jax.units import size_text


class _TerminationRequest:
  """SIGTERM (a scheduler's preemption notice) or Ctrl-C as a step every
  process stops at.

  One process: a handler of SIGTERM and SIGINT sets a flag that the loop reads
  after each step, so the loop saves that step and exits (143 or 130). A
  second Ctrl-C before then exits at once with one line: a save in flight is
  still only orbax's temporary folder, which the next run removes, so every
  kept step stays intact.
  Several: `jax.distributed.initialize` has started JAX's preemption sync
  manager, whose own handler catches SIGTERM on whichever process gets it and
  tells the others through the coordination service; they agree on the step
  after the furthest one any of them has reached, and
  `reached_preemption_sync_point` is true at that step on every process, so
  all save the same step. A Python handler here would replace JAX's, so none
  is installed then.
  """

  def __init__(self):
    self.signal: Optional[int] = None  # the signal received, once one is
    self._shared = jax.process_count() > 1
    self._previous = {}
    # A command's signal watcher leaves the signals to this loop (interrupts).
    self._held = contextlib.ExitStack()
    self._held.enter_context(interrupts.held_by_loop())
    if not self._shared:
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      print(
          'Ctrl-C again: exiting now; the kept checkpoints are intact (an unfinished save '
          'is removed by the next run).',
          file=sys.stderr,
          flush=True,
      )
      os._exit(128 + signal.SIGINT)  # pylint: disable=protected-access
    self.signal = signum

  def at(self, step: int) -> bool:
    """Whether to save and stop after `step`; called once at every step."""
    if self._shared:
      if multihost_utils.reached_preemption_sync_point(step):
        self.signal = signal.SIGTERM
        return True
      return False
    return self.signal is not None

  def describe(self) -> str:
    return 'Ctrl-C' if self.signal == signal.SIGINT else 'SIGTERM'

  def restore(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._held.close()


def _write_json(path: str, payload: Dict[str, Any]) -> None:
  """Writes `payload` to `path` (process 0) whole or not at all."""
  if jax.process_index() == 0:
    storage.write_text(path, json_text(payload, indent=2, sort_keys=True))


def _run_loop(
    run: training_run.TrainingRun,
    actions: Sequence[loop_actions.PeriodicAction],
    guard: divergence.DivergenceGuard,
    logger: MetricLogger,
    first_step: int,
    last: int,
    dropout_key: jax.Array,
) -> bool:
  """Takes steps first_step + 1..last, each followed by the periodic actions
  (`loop_actions`); True when one of them ended the loop early.

  The loop never waits on the device between steps: the batch of step t + 1
  is read and put on the devices while step t runs (dispatch is
  asynchronous), and the losses are fetched only when an action is due. A
  checkpoint keeps the iterator's position after step t's batch, read before
  the next batch, so a resumed run reads step t + 1's batch again.
  """
  iterator = run.data.train_iterator
  next_batch = run.device_batch(next(iterator)) if first_step < last else None
  try:
    for step in range(first_step + 1, last + 1):
      run.state, metrics = _step(run, next_batch, dropout_key)
      for action in actions:
        action.each_step(step, metrics)
      due = [action for action in actions if action.due(step)]
      position = iterator.get_state() if any(action.saves for action in due) else None
      if step < last:
        next_batch = run.device_batch(next(iterator))
      guard.add(step, metrics)
      run.store.check_for_errors()  # A background save that failed stops the run now.
      if not due:
        continue
      guard.check()
      done = loop_actions.StepDone(step, metrics, run, logger, position)
      for action in due:
        started = time.monotonic()
        ends = action.act(done)
        if action.paused:
          logger.exclude(time.monotonic() - started)
        if ends:
          return True
    return False
  except NonFiniteLossError:
    run.store.close()  # its threads stopped, only the one-line error is printed
    raise
  finally:
    for action in actions:
      action.close()
    try:
      run.store.wait()
    finally:
      logger.close()


def _step(
    run: training_run.TrainingRun, batch: Any, dropout_key: jax.Array
) -> Tuple[Any, Dict[str, jax.Array]]:
  """One train step; XLA's out-of-memory as one line."""
  try:
    return run.train_step(run.state, batch, dropout_key)
  except jax.errors.JaxRuntimeError as error:
    if compiled_step.is_out_of_memory(error):
      raise compiled_step.out_of_memory_error(error, run.parts.settings) from None
    raise


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_after: Optional[int] = None,
    actions: Sequence[loop_actions.PeriodicAction] = (),
) -> Optional[Dict[str, Any]]:
  """Trains to config.total_steps (resuming if possible) and evaluates.

  One run at a time per workdir (`workdir_lock`).

  Args:
    config: the run's config.
    workdir: the run's directory (a local path or gs://BUCKET/PATH); an
      existing run there is resumed.
    stop_after: if set, stop with a checkpoint once the run has taken this
      many steps (a budget for now; the run stays resumable to total_steps).
    actions: periodic actions of your own (`loop_actions.PeriodicAction`),
      called after the evaluation and before the checkpoint of each step.

  Returns:
    The final results, also written to workdir/eval_results.json, or None when
    stopped early by stop_after. A perplexity too large to mean anything is
    inf (`evaluation.bounded`), and null in the file.

  Raises:
    ConfigError: bad config, data or workdir, or the workdir is in use by
      another run; nothing in the workdir is changed.
    NonFiniteLossError: more than config.max_skipped_steps steps in a row had
      a non-finite loss or parameters; the message names the kept checkpoints
      and the flags to go on with.
    DivergenceError: the run ended on a step that is not sound, with a
      diverged model's loss (finite, above divergence.DIVERGED_LOSS): the
      same message, and no results are written.
  """
  workdir = storage.location(workdir)
  with workdir_lock.exclusive_workdir(workdir):
    return _train_and_evaluate(config, workdir, stop_after, actions)


def _train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    stop_after: Optional[int],
    own_actions: Sequence[loop_actions.PeriodicAction],
) -> Optional[Dict[str, Any]]:
  start_time = time.time()
  # The config is checked and typed here, once; below, the run reads its settings.
  run = training_run.TrainingRun(run_builder.build_parts(config), workdir)
  task = run.task
  settings = run.parts.settings
  loop = settings.loop
  first_step = int(run.state.step)
  parameter_count = int(sum(x.size for x in jax.tree_util.tree_leaves(run.state.params)))
  tokens_per_step = math.prod(task.batch_shapes(settings)['inputs'][0])
  if first_step < loop.total_steps:
    plan = f'training steps {first_step + 1}..{loop.total_steps}.'
  else:
    plan = (
        f'the run in {workdir} is finished at step {first_step} (total_steps='
        f'{loop.total_steps}): nothing to train, only evaluating it.'
    )
  training_run.report(
      f'{settings.model.attention} model, {parameter_count:,} parameters, attention kernel '
      f'{run.parts.model_config.attention_kernel} ({run.parts.kernel_reason}); '
      f'{run.data.train_sequences:,} training and {run.data.eval_sequences:,} '
      f'{settings.data.eval_split} sequences of {tokens_per_step // loop.batch_size} tokens; '
      f'{plan}'
  )
  dropout_key = jax.random.fold_in(jax.random.PRNGKey(loop.seed), 1)
  cost = compiled_step.StepCost(0, 0, 0.0)
  if first_step < loop.total_steps:
    # Compiled before the loop writes anything: a step that cannot fit stops here.
    compile_start = time.monotonic()
    try:
      run.train_step, cost = compiled_step.compile_train_step(run, dropout_key)
      compiled_step.check_fits(cost, settings)
    except BaseException:
      run.store.close()
      raise
    training_run.report(
        f'train step compiled in {time.monotonic() - compile_start:.1f} s: {cost.describe()}.'
    )
  storage.makedirs(workdir)
  run_builder.save_config(settings, workdir)  # with a copy of each extension file
  parameter_overview.log_parameter_overview(
      run.state.params, include_stats=False, msg='The parameters:', jax_logging_process=0
  )
  logger = MetricLogger(workdir, total_steps=loop.total_steps, is_primary=jax.process_index() == 0)
  logger.discard_after(first_step)
  guard = divergence.DivergenceGuard(
      settings, workdir, run.store, run.ledger, resumed_step=first_step if first_step else None
  )
  last = loop.total_steps
  evaluate = loop_actions.Evaluate(loop.eval_every, last, settings.data.eval_split)
  peak_flops = compiled_step.peak_flops(jax.devices()[0].device_kind)
  actions = [
      loop_actions.Profile(loop.profile_window, workdir, first_step),
      loop_actions.LogProgress(
          loop.log_every, last, tokens_per_step=tokens_per_step, cost=cost, peak_flops=peak_flops
      ),
      evaluate,
      *own_actions,
      loop_actions.SaveCheckpoint(loop.checkpoint_every, last, guard),
      loop_actions.StopAfter(stop_after, last, guard),
      loop_actions.Terminate(_TerminationRequest(), guard),
  ]
  if _run_loop(run, actions, guard, logger, first_step, last, dropout_key):
    return None  # stopped by stop_after, its step saved
  eval_metrics = evaluate.latest
  if eval_metrics is None:
    eval_metrics = run.evaluate()
  final_step = int(run.state.step)
  if not run.ledger.is_sound(final_step):
    # Trained nothing (a finished run, run again): the step's own config diverged, if any.
    saved_config = run.store.restore_config(final_step) if first_step >= last else None
    diverged = guard.unsound_end(final_step, eval_metrics.get('loss'), saved_config)
    if diverged:
      run.store.close()
      raise diverged
  peak_bytes = compiled_step.peak_device_bytes()
  if peak_bytes is not None:
    training_run.report(f'peak device memory {size_text(peak_bytes)}.')
  results = {
      'step': int(run.state.step),
      'eval_split': settings.data.eval_split,
      'task': task.name,
      **loop_actions.prefixed('eval', eval_metrics),
      **task.reference_results(run.data),
      'parameters': parameter_count,
      'wall_time_s': time.time() - start_time,
      **({'peak_device_bytes': peak_bytes} if peak_bytes is not None else {}),
  }
  _write_json(run_folder.RunFolder(workdir).results, results)
  run.store.close()
  return results
