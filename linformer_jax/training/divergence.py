"""Non-finite steps, loss spikes, and going on after a run diverged.

Four parts, used by the training loop (`trainer`):

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
  how to go on: from the newest sound step (`--config.restore_step=N`), and
  at the rate `advised_learning_rate` gives. The ledger records the
  divergence, so the next run in the workdir (`go_back`) refuses the same
  settings in one line, goes back to the sound step by itself when a setting
  changed, and takes a `config.restore_step` only of a sound step. Nothing
  that is the newest sound step is ever removed, across any number of
  re-runs.
* **Ending unsound.** A run whose losses stay finite but high ends on a step
  the ledger holds not sound. When its loss is a diverged model's (above
  `DIVERGED_LOSS`), it reports no results: it stops with the same kind of
  error (`DivergenceGuard.unsound_end`) and records the divergence, also
  for a finished run run again. Otherwise the step is unsound only by the
  spike rule's caution: its results are saved, with a warning.

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

from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import evaluation
from linformer_jax.training.run_config import RunConfig
from linformer_jax.training.sound_steps import SoundStepLedger
from linformer_jax.training.sound_steps import same_training_settings

# How many of the latest non-spike losses the spike rule averages.
SPIKE_WINDOW = 20
# A loss above this, in nats a prediction, is a diverged model's: a perplexity
# above evaluation.PERPLEXITY_LIMIT (1e30), where a uniform guess over a
# million tokens costs 14 nats. A run that ends on a step that is not sound
# with such a loss stops with the divergence error.
DIVERGED_LOSS = math.log(evaluation.PERPLEXITY_LIMIT)


# The highest learning rate the advice gives on its own. AdamW moves each
# weight by about the learning rate per step, and the configs in configs/ peak
# at 1e-4 to 2e-3; a rate that diverged far above this is off by orders of
# magnitude, and tenths of it would take as many divergences to come down.
HIGHEST_ADVISED_LEARNING_RATE = 1e-3


def advised_learning_rate(
    diverged: float, own: Optional[float] = None, source: str = 'the config file'
) -> Tuple[Optional[float], str]:
  """The peak learning rate to go on with after `diverged` diverged, and the
  words that say why ('Go on with ...').

  `own` is the rate `source` sets, where the command overrode it (None: the
  command did not). When it is lower than the rate that diverged, the advice
  is to drop the override (returned as None). Else a tenth of the rate, but
  at most HIGHEST_ADVISED_LEARNING_RATE.
  """
  if own is not None and own < diverged:
    return None, f"{source}'s own learning rate, {own:g} (the override {diverged:g} diverged)"
  if diverged / 10 > HIGHEST_ADVISED_LEARNING_RATE:
    return HIGHEST_ADVISED_LEARNING_RATE, (
        f'a learning rate of {HIGHEST_ADVISED_LEARNING_RATE:g}: {diverged:g} is orders of '
        'magnitude above the rates AdamW trains these models with (configs/ peak at 1e-4 to 2e-3)'
    )
  return diverged / 10, 'a lower learning rate (a tenth is a first guess)'


class DivergenceError(ConfigError):
  """A run diverged, or a re-run would go on from where one did.

  Attributes:
    summary: what happened and which checkpoints are kept (one line).
    learning_rate: the peak learning rate of the run that diverged.
    restore_step: the sound step to go on from, or None.
    restart_workdir: with no sound step kept, a new workdir to start again
      in; None where there is a sound step, or nothing was saved (the same
      workdir starts again).
  """

  def __init__(
      self,
      summary: str,
      *,
      learning_rate: float,
      restore_step: Optional[int] = None,
      restart_workdir: Optional[str] = None,
  ):
    rate, why = advised_learning_rate(learning_rate)
    self.summary = summary
    self.learning_rate = learning_rate
    self.restore_step = restore_step
    self.restart_workdir = restart_workdir
    super().__init__(f'{summary} Go on with {why}: add {" ".join(self.train_flags(rate))}.')

  def train_flags(self, learning_rate: Optional[float]) -> List[str]:
    """The `train` flags that go on at `learning_rate` (None: the config
    file's own, so no flag of it)."""
    flags = []
    if self.restore_step is not None:
      flags.append(f'--config.restore_step={self.restore_step}')
    elif self.restart_workdir:
      flags.append(f'--workdir={self.restart_workdir}')
    if learning_rate is not None:
      flags.append(f'--config.learning_rate={learning_rate:g}')
    return flags


class NonFiniteLossError(DivergenceError):
  """More than config.max_skipped_steps non-finite steps came in a row, or the
  settings of a run that diverged were given again (`go_back`)."""


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
      settings: RunConfig,
      workdir: str,
      store: CheckpointStore,
      ledger: Optional[SoundStepLedger] = None,
      resumed_step: Optional[int] = None,
  ):
    self._max_skipped = settings.loop.max_skipped_steps
    self._factor = settings.loop.spike_factor
    self._settings = settings
    self._workdir = workdir
    self._store = store
    self.ledger = ledger if ledger is not None else SoundStepLedger(workdir)
    self._pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self._recent: Deque[float] = collections.deque(maxlen=SPIKE_WINDOW)
    self._skipped = 0  # non-finite steps in a row, up to the last one checked
    self._first_bad: Optional[Tuple[int, float]] = None  # (step, loss) that began them
    self._last_loss: Optional[float] = None  # of the last step checked
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
      self._last_loss = loss
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
    summary = (
        f'Training diverged: at step {first} {what}, and steps {first}..{step} were all '
        f'non-finite (more than config.max_skipped_steps={self._max_skipped} in a row); '
        'stopped without saving.'
    )
    return self._going_on(NonFiniteLossError, summary, began=first)

  def unsound_end(
      self, step: int, eval_loss: Optional[float], saved_config: Optional[Dict[str, Any]] = None
  ) -> Optional[DivergenceError]:
    """For a run that ended at `step` on a state the ledger holds not sound:
    the error to stop with when the state is a diverged model's, else None.

    Its evaluation loss (else its last training loss) decides: above
    DIVERGED_LOSS, or not finite, it has diverged, and the divergence is
    recorded in the ledger as for `NonFiniteLossError`. Below, the step is
    not sound by the spike rule's caution alone (fewer than SPIKE_WINDOW
    normal losses since a spike) or by its norm; its results are the
    model's own, and a warning says the step is not sound. `saved_config` is
    the config the step was trained with, where this process trained nothing
    (a finished run, run again); else the guard's own.
    """
    why = self.ledger.why(step)
    last = self._last_loss
    loss = eval_loss if eval_loss is not None else last
    if loss is None or loss <= DIVERGED_LOSS:
      self._store.wait()
      sound = self.ledger.newest_sound(self._store.all_steps())
      logging.warning(
          'Step %d, the last, is not sound (%s); its results are saved, its loss (%s) being a '
          "model's, not a diverged one's.%s",
          step,
          why,
          'unknown' if loss is None else f'{loss:.4g}',
          f' The newest sound step is {sound}.' if sound is not None else '',
      )
      return None
    named = [(self._settings.data.eval_split, eval_loss), ('training', last)]
    losses = [f'its {name} loss {value:,.6g}' for name, value in named if value is not None]
    summary = (
        f'Training diverged: step {step}, the last, is not sound ({why}); '
        f'{" and ".join(losses)} (above {DIVERGED_LOSS:.0f} nats: a perplexity above 1e30)'
    )
    if self._recent and self._phase_spike is not None:
      summary += (
          f', against {sum(self._recent) / len(self._recent):.4g} before the loss spiked at '
          f'step {self._phase_spike}'
      )
    summary += '. No results were saved.'
    return self._going_on(DivergenceError, summary, self._phase_spike, saved_config)

  def _going_on(
      self,
      error: type,
      summary: str,
      began: Optional[int],
      saved_config: Optional[Dict[str, Any]] = None,
  ) -> DivergenceError:
    """`error` (a DivergenceError class) with `summary`, the kept steps and
    how to go on; records in the ledger that the run diverged at step `began`
    (None: not known) with `saved_config` (default: the config of the
    guard's settings)."""
    self._store.wait()
    kept = self._store.all_steps()
    sound = self.ledger.newest_sound(kept)
    config = _as_json(saved_config if saved_config is not None else self._settings.to_dict())
    self.ledger.diverged = {'step': began, 'sound_step': sound, 'config': config}
    rate = config['learning_rate']
    if not kept:
      return error(f'{summary} No checkpoint was saved.', learning_rate=rate)
    self.ledger.write()
    summary += f' Kept checkpoints in {self._store.directory}: steps {", ".join(map(str, kept))};'
    if sound is not None:
      summary += f' step {sound} is from before the divergence.'
      return error(summary, learning_rate=rate, restore_step=sound)
    summary += ' none is from before the divergence: start again in a new workdir.'
    return error(
        summary, learning_rate=rate, restart_workdir=f'{self._workdir.rstrip("/")}-restart'
    )


def _flag_name(argument: str, keyed: Sequence[str]) -> str:
  """An argument's flag (`--config.learning_rate=1` -> `--config.learning_rate`),
  with its key for a flag of `keyed` (`--set=learning_rate=1` -> `--set=learning_rate`)."""
  flag, _, value = argument.partition('=')
  return f'{flag}={value.partition("=")[0].strip()}' if flag in keyed else flag


def command_to_go_on(
    argv: Sequence[str],
    flags: Sequence[str],
    *,
    dropped: Sequence[str] = (),
    program: str = 'linformer_jax.train',
    keyed: Sequence[str] = (),
) -> str:
  """The exact command to go on: `python -m PROGRAM` with `argv` (the flags of
  the run that diverged) less the arguments that `flags` set again or that
  `dropped` names, then `flags`.

  An argument is named by its flag; the flags of `keyed` (a sweep's `--set`,
  whose values are KEY=VALUE) by their key too, so that `--set=learning_rate=X`
  replaces only the learning rate. A value given as the next argument
  (`--workdir DIR`) goes with its flag.
  """
  replaced = {_flag_name(flag, keyed) for flag in flags} | set(dropped)
  kept: List[str] = []
  index = 0
  while index < len(argv):
    argument = argv[index]
    with_value = '=' not in argument and index + 1 < len(argv)
    whole = f'{argument}={argv[index + 1]}' if with_value else argument
    if _flag_name(whole, keyed) in replaced:
      index += 2 if with_value else 1
      continue
    kept.append(argument)
    index += 1
  return f'python -m {program} ' + shlex.join(kept + list(flags))


def _as_json(value: Any) -> Any:
  return json.loads(json.dumps(value))


def go_back(
    store: CheckpointStore,
    settings: RunConfig,
    workdir: str,
    ledger: Optional[SoundStepLedger] = None,
) -> None:
  """Honours config.restore_step (0 = the newest) of the run's `settings` and
  the ledger's divergence: makes the chosen kept step the newest, moving
  newer ones to WORKDIR/diverged_checkpoints/from_STEP.

  After a divergence (the ledger's `diverged`), with no restore_step: the same
  training settings are refused (they would go on from where the run
  diverged); changed ones go back to the newest sound step. A restore_step
  must name a sound step.

  A run that went back and saved since holds a newest checkpoint saved with
  this very config (`settings.to_dict()`); the same command then resumes
  from it (after a preemption, say) instead of going back again.

  Raises:
    NonFiniteLossError: the diverged run's own settings again; it says how
      to go on from the sound step.
    ConfigError: the step is not kept or not sound (the message lists the
      sound kept steps), or no sound step is left.
  """
  ledger = ledger if ledger is not None else SoundStepLedger(workdir)
  step = settings.loop.restore_step
  kept = store.all_steps()
  diverged = ledger.diverged
  if not step and diverged:
    sound = ledger.newest_sound(kept)
    if diverged['step'] is not None:
      what = f"diverged at step {diverged['step']}"
    else:  # it ended on a diverged step (`DivergenceGuard.unsound_end`)
      what = 'diverged' + (f', ending at step {kept[-1]}' if kept else '')
    if same_training_settings(settings.to_dict(), diverged['config']):
      summary = (
          f"Refused: {workdir}'s run {what} with these same settings, and its newest "
          'checkpoints are not sound;'
      )
      if sound is None:
        raise NonFiniteLossError(
            f'{summary} none is sound: start again in a new workdir.',
            learning_rate=settings.optimizer.learning_rate,
            restart_workdir=f'{workdir.rstrip("/")}-restart',
        )
      raise NonFiniteLossError(
          f'{summary} step {sound} is the newest sound one.',
          learning_rate=settings.optimizer.learning_rate,
          restore_step=sound,
      )
    if sound is None:
      raise ConfigError(
          f"{workdir}'s run {what} and none of its kept steps "
          f'({", ".join(map(str, kept)) or "none"}) is sound: start again in a new --workdir.'
      )
    logging.warning(
        'The run in %s %s; the settings changed, so it goes on from step %d, its newest '
        'sound checkpoint.',
        workdir,
        what,
        sound,
    )
    step = sound
  if not step:
    return
  if kept and step == kept[-1] and ledger.is_sound(step):
    _clear_divergence(ledger, kept)
    return
  if kept and store.restore_config(kept[-1]) == _as_json(settings.to_dict()):
    logging.info('Resuming step %d, saved since going back to step %d.', kept[-1], step)
    return
  sound_steps = [s for s in kept if ledger.is_sound(s)]
  listed = ', '.join(map(str, sound_steps)) or 'none'
  if step not in kept:
    store.refuse_damaged(step, asked_as=f'config.restore_step={step}: ')
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
