"""What the training loop does between steps, one periodic action each.

After every step the loop (`trainer`) calls each action's `each_step`, asks
each whether it is `due`, and, when some are, checks the steps since the last
check for divergence (one wait on the device) and calls the due ones' `act`
in order. An action whose `act` returns True ends the loop after that step.
In the style of clu's `periodic_actions`, each keeps its own state:

  LogProgress       the progress line and the train_* scalars, every log_every
  Evaluate          the evaluation, every eval_every and after the last step
  SaveCheckpoint    a checkpoint every checkpoint_every and after the last step
  StopAfter         `train_and_evaluate(stop_after=N)`: save step N and stop
  Terminate         SIGTERM or Ctrl-C: save the step reached, then exit 143/130
  Profile           clu's trace of config.profile_steps

A researcher adds an action of their own, an extra evaluation say, by
subclassing `PeriodicAction` and passing it to
`trainer.train_and_evaluate(config, workdir, actions=[...])`
(docs/extending.md): the loop itself does not change.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple

import jax

from linformer_jax import run_folder
from linformer_jax.training import compiled_step
from linformer_jax.training import divergence
from linformer_jax.training import evaluation
from linformer_jax.training import training_run
from linformer_jax.training.metric_writers import MetricLogger


def is_due(step: int, every: int, last_step: int) -> bool:
  """Whether a periodic action is due after `step`: every `every` steps and
  after the last one."""
  return step % every == 0 or step == last_step


def prefixed(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
  return {f'{prefix}_{name}': value for name, value in metrics.items()}


@dataclasses.dataclass
class StepDone:
  """What a due action sees after a step.

  Attributes:
    step: the step just taken (the state is the state after it).
    metrics: its metrics, still on the device ('loss', 'finite', ...): fetch
      them with jax.device_get only when needed, since that waits for the step.
    run: the run (state, store, evaluation, the task's data).
    logger: the run's metric writer (`write_scalars`).
    data_position: the data iterator's position after this step's batch when
      an action that saves is due (`PeriodicAction.saves`), else None.
  """

  step: int
  metrics: Dict[str, jax.Array]
  run: training_run.TrainingRun
  logger: MetricLogger
  data_position: Optional[Any] = None


class PeriodicAction:
  """A hook of the training loop: `each_step` after every step, then `act`
  after each step where `due` is true.

  Attributes:
    saves: `act` saves a checkpoint, so the loop reads the data iterator's
      position for it (`StepDone.data_position`) before reading ahead.
    paused: the loop leaves the time `act` takes out of the progress line's
      rates (an evaluation, a save); False for an action whose time is the
      step's own (fetching the step's loss waits for the step).
  """

  saves = False
  paused = True

  def each_step(self, step: int, metrics: Dict[str, jax.Array]) -> None:
    """Called after every step, due or not; must not wait on the device."""
    del step, metrics

  def due(self, step: int) -> bool:
    """Whether to `act` after `step`; called once after every step."""
    del step
    return False

  def act(self, done: StepDone) -> bool:
    """Does the action; True ends the loop after this step."""
    del done
    return False

  def close(self) -> None:
    """Called once when the loop ends, however it ends."""


class Every(PeriodicAction):
  """An action due every `every` steps and after the last step."""

  def __init__(self, every: int, last_step: int):
    self.every = every
    self.last_step = last_step

  def due(self, step: int) -> bool:
    return is_due(step, self.every, self.last_step)


class LogProgress(Every):
  """The progress line and the train_* scalars (loss, learning rate, rates)."""

  paused = False

  def __init__(
      self,
      every: int,
      last_step: int,
      *,
      tokens_per_step: int,
      cost: compiled_step.StepCost,
      peak_flops: Optional[float],
  ):
    super().__init__(every, last_step)
    self.tokens_per_step = tokens_per_step
    self.cost = cost
    self.peak_flops = peak_flops

  def act(self, done: StepDone) -> bool:
    scalars = jax.device_get(done.metrics)
    scalars = {name: float(value) for name, value in scalars.items() if name != 'finite'}
    scalars['learning_rate'] = float(done.run.schedule(done.step - 1))
    scalars.update(
        done.logger.progress(
            done.step,
            tokens_per_step=self.tokens_per_step,
            loss=scalars['loss'],
            flops_per_step=self.cost.flops,
            peak_flops=self.peak_flops,
        )
    )
    done.logger.write_scalars(done.step, prefixed('train', scalars))
    return False


class Evaluate(Every):
  """The task's evaluation, written as eval_* scalars and reported;
  `latest` holds the newest metrics."""

  def __init__(self, every: int, last_step: int, eval_split: str):
    super().__init__(every, last_step)
    self.eval_split = eval_split
    self.latest: Optional[Dict[str, float]] = None

  def act(self, done: StepDone) -> bool:
    self.latest = done.run.evaluate()
    done.logger.write_scalars(done.step, prefixed('eval', self.latest))
    training_run.report(
        f'step {done.step}: {done.run.task.describe(self.eval_split, self.latest)}'
        + evaluation.perplexity_note(self.latest.get('perplexity'))
    )
    return False


class SaveCheckpoint(Every):
  """A checkpoint (orbax saves in the background), its soundness recorded."""

  saves = True

  def __init__(self, every: int, last_step: int, guard: divergence.DivergenceGuard):
    super().__init__(every, last_step)
    self.guard = guard

  def act(self, done: StepDone) -> bool:
    done.run.save(data_position=done.data_position, guard=self.guard)
    return False


class StopAfter(PeriodicAction):
  """Saves step `stop_after` and ends the loop there (a budget for now; the
  run stays resumable to total_steps)."""

  saves = True

  def __init__(self, stop_after: Optional[int], last_step: int, guard):
    self.stop_after = stop_after
    self.last_step = last_step
    self.guard = guard

  def due(self, step: int) -> bool:
    return self.stop_after is not None and self.stop_after <= step < self.last_step

  def act(self, done: StepDone) -> bool:
    done.run.save(force=True, data_position=done.data_position, guard=self.guard)
    return True


class Terminate(PeriodicAction):
  """SIGTERM or Ctrl-C (`termination`, asked once after every step): saves
  the step reached, waits for the save and exits 143 or 130."""

  saves = True

  def __init__(self, termination: Any, guard: divergence.DivergenceGuard):
    self.termination = termination
    self.guard = guard

  def due(self, step: int) -> bool:
    return self.termination.at(step)

  def act(self, done: StepDone) -> bool:
    training_run.report(
        f'{self.termination.describe()} received: saving the checkpoint of step {done.step}, '
        'then exiting.'
    )
    done.run.save(force=True, data_position=done.data_position, guard=self.guard)
    done.run.store.wait()
    raise SystemExit(128 + self.termination.signal)

  def close(self) -> None:
    self.termination.restore()


class Profile(PeriodicAction):
  """clu's profiler tracing steps `window` = (FIRST, LAST) into WORKDIR/profile
  (TensorBoard's profile plugin reads WORKDIR/profile/plugins/profile/...).

  A resumed run inside the window traces the rest of it; after it, nothing.
  """

  def __init__(self, window: Optional[Tuple[int, int]], workdir: str, first_step: int):
    if window and first_step >= window[0]:
      window = (first_step + 1, window[1]) if first_step < window[1] else None
    self.window = window
    self.done = first_step
    self.profiler = None
    if not window:
      return
    # Imported only to profile: clu's periodic_actions imports TensorFlow,
    # seconds that a run without a trace should not spend.
    from clu import periodic_actions  # pylint: disable=g-import-not-at-top

    self.profiler = periodic_actions.Profile(
        logdir=run_folder.RunFolder(workdir).profile,
        num_profile_steps=window[1] - window[0] + 1,
        profile_duration_ms=None,
        first_profile=window[0] - 1,
        every_steps=None,
        every_secs=None,
    )
    self.profiler(first_step)  # starts the trace at FIRST - 1

  def each_step(self, step: int, metrics: Dict[str, jax.Array]) -> None:
    self.done = step
    if self.profiler is None:
      return
    if step == self.window[1]:
      jax.block_until_ready(metrics)  # the trace holds the whole of the last step
    self.profiler(step)

  def close(self) -> None:
    if self.profiler is not None and self.window[0] - 1 <= self.done < self.window[1]:
      jax.profiler.stop_trace()  # stopped inside the window
