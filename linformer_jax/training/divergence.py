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
  measured on the state of step t - 1, so that state is already suspect:
  every kept step from t - 1 on, and every step saved until `SPIKE_WINDOW`
  normal losses come in a row, is marked not sound in the workdir's ledger
  (`sound_steps`), and the newest sound kept step of t - 2 or earlier is
  protected (`CheckpointStore.protect`), so that it outlives the newest
  `keep_checkpoints`. A step the ledger holds not sound is never protected,
  so a later spike never moves the protection off the newest sound step.
* **Going on.** The divergence error is one line naming the kept steps and
  the flags to go on with: `--config.restore_step=N` (the newest sound step)
  and a tenth of the learning rate. The ledger records the divergence, so
  the next run in the workdir (`go_back`) refuses the same settings in one
  line, goes back to the sound step by itself when a setting changed, and
  takes a `config.restore_step` only of a sound step. Nothing that is the
  newest sound step is ever removed, across any number of re-runs.

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
from linformer_jax.training.sound_steps import SoundStepLedger
from linformer_jax.training.sound_steps import same_training_settings

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
  non-finite steps come in a row; on each spike marks the kept steps from
  the state before it onwards as not sound in the workdir's ledger
  (`sound_steps`) and protects the newest sound one (see the module
  docstring). A run that resumes takes up the spike rule's losses and its
  suspect phase from the ledger entry of the step it resumed.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      workdir: str,
      store: CheckpointStore,
      ledger: Optional[SoundStepLedger] = None,
      resumed_step: Optional[int] = None,
  ):
    self._max_skipped = config.max_skipped_steps
    self._factor = config.spike_factor
    self._learning_rate = config.learning_rate
    self._config = config
    self._workdir = workdir
    self._store = store
    self.ledger = ledger if ledger is not None else SoundStepLedger(workdir)
    self._pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self._recent: Deque[float] = collections.deque(maxlen=SPIKE_WINDOW)
    self._skipped = 0  # non-finite steps in a row, up to the last one checked
    self._first_bad: Optional[Tuple[int, float]] = None  # (step, loss) that began them
    self._last_spike: Optional[int] = None
    # From this step on, states are suspect, until SPIKE_WINDOW normal losses in a row.
    self._suspect_since: Optional[int] = None
    self._phase_spike: Optional[int] = None  # the spike that began the suspect phase
    self._normal_in_a_row = 0
    if resumed_step is not None:
      self._recent.extend(self.ledger.recent_losses(resumed_step))
      if not self.ledger.is_sound(resumed_step):
        self._suspect_since = resumed_step

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
        self._normal_in_a_row += 1
        if self._normal_in_a_row >= SPIKE_WINDOW:
          self._suspect_since = None
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

  def suspicion(self, step: int) -> str:
    """Why the state of `step` (all losses up to it checked) is suspect, or ''."""
    if self._suspect_since is None or step < self._suspect_since:
      return ''
    if self._phase_spike is None:
      return 'saved while the loss was spiking (since before the run resumed)'
    return f'saved while the loss was spiking (since step {self._phase_spike})'

  def recent_losses(self) -> List[float]:
    return list(self._recent)

  def _on_spike(self, step: int, back: int) -> None:
    self._last_spike = step
    self._normal_in_a_row = 0
    suspect_from = step - back + 1
    if self._suspect_since is None:
      self._phase_spike = step
    if self._suspect_since is None or suspect_from < self._suspect_since:
      self._suspect_since = suspect_from
    self._store.wait()  # a save in flight is not a step folder yet
    kept = self._store.all_steps()
    why = f'saved from the state before the loss spike at step {step}'
    changed = self.ledger.mark_suspect([s for s in kept if s >= suspect_from], why)
    sound = self.ledger.newest_sound(kept, at_most=step - back)
    if sound is not None and sound not in self._store.protected_steps():
      for old in self._store.protected_steps():
        self._store.unprotect(old)
      self._store.protect(sound)
      logging.warning(
          'Loss spike at step %d: keeping the checkpoint of step %d from before it.', step, sound
      )
    if changed or sound is not None:
      self.ledger.write()

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
    sound = self.ledger.newest_sound(kept)
    self.ledger.diverged = {
        'step': first,
        'sound_step': sound,
        'config': json.loads(json.dumps(self._config.to_dict())),
    }
    if kept:
      self.ledger.write()
    if not kept:
      return NonFiniteLossError(f'{summary} No checkpoint was saved.', [lower])
    directory = self._store.directory
    summary += f' Kept checkpoints in {directory}: steps {", ".join(map(str, kept))};'
    if sound is not None:
      summary += f' step {sound} is from before the divergence.'
      return NonFiniteLossError(summary, [f'--config.restore_step={sound}', lower])
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


def go_back(
    store: CheckpointStore,
    config: ml_collections.ConfigDict,
    workdir: str,
    ledger: Optional[SoundStepLedger] = None,
) -> None:
  """Honours config.restore_step (0 = the newest) and the ledger's divergence:
  makes the chosen kept step the newest, moving newer ones to
  WORKDIR/diverged_checkpoints/from_STEP.

  After a divergence (the ledger's `diverged`), with no restore_step: the same
  training settings are refused (they would go on from where the run
  diverged); changed ones go back to the newest sound step. A restore_step
  must name a sound step.

  A run that went back and saved since holds a newest checkpoint saved with
  this very config; the same command then resumes from it (after a
  preemption, say) instead of going back again.

  Raises:
    NonFiniteLossError: the diverged run's own settings again; its flags go
      on from the sound step.
    ConfigError: the step is not kept or not sound (the message lists the
      sound kept steps), or no sound step is left.
  """
  ledger = ledger if ledger is not None else SoundStepLedger(workdir)
  step = config.restore_step
  kept = store.all_steps()
  diverged = ledger.diverged
  if not step and diverged:
    sound = ledger.newest_sound(kept)
    if same_training_settings(config.to_dict(), diverged['config']):
      summary = (
          f"Refused: {workdir}'s run diverged at step {diverged['step']} with these same "
          'settings, and its newest checkpoints are not sound;'
      )
      lower = f'--config.learning_rate={config.learning_rate / 10:g}'
      if sound is None:
        raise NonFiniteLossError(
            f'{summary} none is sound: start again in a new workdir.',
            [f'--workdir={workdir.rstrip("/")}-restart', lower],
        )
      raise NonFiniteLossError(
          f'{summary} step {sound} is the newest sound one.',
          [f'--config.restore_step={sound}', lower],
      )
    if sound is None:
      raise ConfigError(
          f"{workdir}'s run diverged at step {diverged['step']} and none of its kept steps "
          f'({", ".join(map(str, kept)) or "none"}) is sound: start again in a new --workdir.'
      )
    logging.warning(
        'The run in %s diverged at step %d; the settings changed, so it goes on from '
        'step %d, its newest sound checkpoint.',
        workdir,
        diverged['step'],
        sound,
    )
    step = sound
  if not step:
    return
  if kept and step == kept[-1] and ledger.is_sound(step):
    _clear_divergence(ledger, kept)
    return
  if kept and store.restore_config(kept[-1]) == _as_json(config.to_dict()):
    logging.info('Resuming step %d, saved since going back to step %d.', kept[-1], step)
    return
  sound_steps = [s for s in kept if ledger.is_sound(s)]
  listed = ', '.join(map(str, sound_steps)) or 'none'
  if step not in kept:
    raise ConfigError(
        f'config.restore_step={step}: {workdir} keeps no checkpoint of step {step}; kept '
        f'sound steps: {listed} (0 = the newest).'
    )
  if not ledger.is_sound(step):
    raise ConfigError(
        f'config.restore_step={step}: step {step} of {workdir} is not sound '
        f'({ledger.why(step)}); kept sound steps: {listed}.'
    )
  moved = store.go_back_to(step)
  ledger.forget(moved)
  _clear_divergence(ledger, store.all_steps())


def _clear_divergence(ledger: SoundStepLedger, kept: Sequence[int]) -> None:
  if ledger.diverged is not None or set(ledger.steps) - set(kept):
    ledger.diverged = None
    ledger.keep_only(kept)
    ledger.write()
