"""Non-finite steps, loss spikes, and going on after a run diverged.

Three parts, used by the training loop (`trainer`):

* **Skipping.** The train step applies no update whose loss, parameters or
  optimizer state are non-finite (`train_steps.train_step`); it reports
  `finite=False` and the state stays as it was. `DivergenceGuard` counts such
  steps in a row and stops the run once more than `config.max_skipped_steps`
  come one after another, so an isolated bad batch costs one step and a
  diverged run stops.
* **Spikes.** A loss is a spike when it is non-finite, or when it is above
  `config.spike_factor` times the mean of the last `SPIKE_WINDOW` losses
  before it that were not spikes (at least one). The loss of step t is
  measured on the state of step t - 1, so that state is already suspect: the
  guard protects the newest kept checkpoint of step t - 2 or earlier
  (`CheckpointStore.protect`), one at a time, so that it outlives the newest
  `keep_checkpoints`. A spike within `SPIKE_WINDOW` steps of the previous one
  leaves the protection where it is.
* **Going on.** The divergence error is one line naming the kept steps and
  the flags to go on with: `--config.restore_step=N` (the protected step) and
  a tenth of the learning rate. `go_back` honours `config.restore_step`.

The guard reads the device only when the loop checks it (a log line, an
evaluation, a checkpoint or a stop is due), so it adds no wait per step.
"""

import collections
import json
import math
import shlex
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from absl import logging
import jax
import ml_collections

from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError

# How many of the latest non-spike losses the spike rule averages.
SPIKE_WINDOW = 20


class NonFiniteLossError(ConfigError):
  """More than config.max_skipped_steps non-finite steps came in a row.

  Attributes:
    summary: what happened and which checkpoints are kept (one line).
    flags: the command-line flags to go on with.
  """

  def __init__(self, summary: str, flags: List[str]):
    super().__init__(f'{summary} Add {" ".join(flags)} to the command to go on.')
    self.summary = summary
    self.flags = flags


def is_spike(loss: float, recent: Sequence[float], factor: float) -> bool:
  """The spike rule: non-finite, or above `factor` x the mean of `recent`
  (never with no recent loss or factor 0)."""
  if not math.isfinite(loss):
    return True
  if factor <= 0 or not recent:
    return False
  return loss > factor * sum(recent) / len(recent)


class DivergenceGuard:
  """Checks the steps' `finite` flags and losses when the loop asks.

  Raises NonFiniteLossError once more than `config.max_skipped_steps`
  non-finite steps come in a row; protects a checkpoint from before each
  spike (see the module docstring).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, store: CheckpointStore):
    # A config saved before these fields existed (configs/from_workdir.py)
    # keeps the behaviour of its time: stop at the first bad step.
    self._max_skipped = config.get('max_skipped_steps', 0)
    self._factor = config.get('spike_factor', 0.0)
    self._learning_rate = config.learning_rate
    self._workdir = workdir
    self._store = store
    self._pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self._recent: Deque[float] = collections.deque(maxlen=SPIKE_WINDOW)
    self._skipped = 0  # non-finite steps in a row, up to the last one checked
    self._first_bad: Optional[Tuple[int, float]] = None  # (step, loss) that began them
    self._last_spike: Optional[int] = None
    self._pre_spike: Optional[int] = None  # the step this run protected

  def add(self, step: int, metrics: Dict[str, jax.Array]) -> None:
    self._pending.append((step, metrics))

  def check(self) -> None:
    """Goes through the steps since the last check (one wait on the device)."""
    fetched = jax.device_get([(m['finite'], m['loss']) for _, m in self._pending])
    for (step, _), (finite, loss) in zip(self._pending, fetched):
      loss = float(loss)
      if is_spike(loss, self._recent, self._factor):
        self._on_spike(step, back=2)
      elif not finite and self._skipped == 0:
        # A normal loss whose update overflowed: the state of step - 1 is sound.
        self._on_spike(step, back=1)
      elif finite:
        self._recent.append(loss)
      if finite:
        self._skipped = 0
        continue
      self._skipped += 1
      if self._skipped == 1:
        self._first_bad = (step, loss)
      if self._skipped > self._max_skipped:
        self._pending.clear()
        raise self._error(step)
    self._pending.clear()

  def _on_spike(self, step: int, back: int) -> None:
    recent_spike = self._last_spike is not None and step - self._last_spike <= SPIKE_WINDOW
    self._last_spike = step
    if recent_spike and self._pre_spike is not None:
      return
    self._store.wait()  # a save in flight is not a step folder yet
    before = [kept for kept in self._store.all_steps() if kept <= step - back]
    if not before:
      return
    for old in self._store.protected_steps():
      if old != before[-1]:
        self._store.unprotect(old)
    self._store.protect(before[-1])
    self._pre_spike = before[-1]
    logging.warning(
        'Loss spike at step %d: keeping the checkpoint of step %d from before it.',
        step,
        before[-1],
    )

  def _error(self, step: int) -> NonFiniteLossError:
    first, loss = self._first_bad
    what = (
        f'the training loss is {loss}'
        if not math.isfinite(loss)
        else f'the parameters became non-finite (loss {loss})'
    )
    self._store.wait()
    kept = self._store.all_steps()
    summary = (
        f'Training diverged: at step {first} {what}, and steps {first}..{step} were all '
        f'non-finite (more than config.max_skipped_steps={self._max_skipped} in a row); '
        'stopped without saving.'
    )
    lower = f'--config.learning_rate={self._learning_rate / 10:g}'
    if not kept:
      return NonFiniteLossError(f'{summary} No checkpoint was saved.', [lower])
    directory = self._store.directory
    summary += f' Kept checkpoints in {directory}: steps {", ".join(map(str, kept))};'
    if self._pre_spike in kept:
      summary += f' step {self._pre_spike} is from before the divergence.'
      return NonFiniteLossError(summary, [f'--config.restore_step={self._pre_spike}', lower])
    summary += ' none is from before the divergence: start again in a new workdir.'
    return NonFiniteLossError(summary, [f'--workdir={self._workdir.rstrip("/")}-restart', lower])


def command_to_go_on(error: NonFiniteLossError, argv: Sequence[str]) -> str:
  """The exact `train` command to go on: `argv` (the flags of the run that
  diverged) with the error's flags in place of any it had."""
  replaced = {flag.split('=', 1)[0] for flag in error.flags}
  kept: List[str] = []
  skip_value = False
  for argument in argv:
    if skip_value:
      skip_value = False
      continue
    name = argument.split('=', 1)[0]
    if name in replaced:
      skip_value = '=' not in argument  # `--flag VALUE`: drop VALUE too
      continue
    kept.append(argument)
  return 'python -m linformer_jax.train ' + shlex.join(kept + error.flags)


def _as_json(value: Any) -> Any:
  return json.loads(json.dumps(value))


def go_back(store: CheckpointStore, config: ml_collections.ConfigDict, workdir: str) -> None:
  """Honours config.restore_step (0 = the newest): makes that kept step the
  newest, moving newer ones to WORKDIR/diverged_checkpoints/from_STEP.

  A run that went back and saved since holds a newest checkpoint saved with
  this very config; the same command then resumes from it (after a
  preemption, say) instead of going back again.

  Raises:
    ConfigError: the step is not kept (the message lists the kept steps).
  """
  step = config.get('restore_step', 0)
  if not step:
    return
  kept = store.all_steps()
  if kept and step == kept[-1]:
    return
  if kept and store.restore_config(kept[-1]) == _as_json(config.to_dict()):
    logging.info('Resuming step %d, saved since going back to step %d.', kept[-1], step)
    return
  if step not in kept:
    listed = ', '.join(map(str, kept)) or 'none'
    raise ConfigError(
        f'config.restore_step={step}: {workdir} keeps no checkpoint of step {step}; kept steps: '
        f'{listed} (0 = the newest).'
    )
  store.go_back_to(step)
