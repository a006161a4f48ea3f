"""Which kept checkpoints are sound, recorded in the workdir so every run sees it.

A run writes WORKDIR/sound_steps.json (process 0, whole or not at all) after
each save and when it diverges. It holds, per kept step:

  sound          whether the run could go on from it: its parameters and
                 optimizer state are finite, it was not saved while the loss
                 was spiking (from the state before a spike until
                 `divergence.SPIKE_WINDOW` normal losses in a row), and its
                 parameter norm is at most `PARAM_NORM_FACTOR` times the
                 largest norm of a sound step before it (weights blown up
                 while the loss stays finite are not sound)
  why            for a step that is not sound, the reason
  param_norm     the global L2 norm of its parameters
  recent_losses  the losses the spike rule averages at that step, so that a
                 resumed run judges spikes as the uninterrupted one would

and, once a run has stopped on a divergence, `diverged`: the step it began
(None where not known: a run that ended on a diverged step, see
`divergence.DivergenceGuard.unsound_end`), the newest sound step, and the
config of the run that diverged. A later run reads it before it restores
anything (`divergence.go_back`): the same command again is refused in one line
naming the sound step; a changed setting goes back to the sound step by
itself; `config.restore_step` must name a sound step.

A step the ledger does not list (a workdir from before it, an imported
checkpoint) counts as sound.

A ledger that cannot be read (not JSON, or not the ledger's shape) is refused
in one line naming the file and the fix: it has no safe stand-in, since
reading it as empty would count a step saved while the run diverged as sound.
"""

import json
import numbers
from typing import Any, Dict, List, Optional, Sequence

import jax

from linformer_jax import registry
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import ConfigError

# A step whose parameter norm is above this times the largest norm of an
# earlier sound step is not sound (blown-up weights whose loss is finite).
PARAM_NORM_FACTOR = 4.0
# Settings that change nothing in how the run trains: a re-run of a diverged
# command that changes only these is the same command.
BOOKKEEPING_FIELDS = (
    'restore_step',
    'log_every',
    'eval_every',
    'checkpoint_every',
    'keep_checkpoints',
    'profile_steps',
    'compilation_cache_dir',
    'platform',
)


def _training_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  return {key: value for key, value in config.items() if key not in BOOKKEEPING_FIELDS}


def same_training_settings(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
  """Whether two configs (as dicts) train alike, bookkeeping fields aside.

  A setting a registered part declares (`registry.Setting`) that one config
  holds at its default and the other lacks is the same: a process that
  imported more extensions adds their settings to every config it builds.
  """
  as_json = lambda config: json.loads(json.dumps(_training_settings(config), sort_keys=True))
  a, b = as_json(a), as_json(b)
  # The sections parts declare settings in: config.model (projections and
  # attention kinds), config.data (classification sources).
  for section in ('model', 'data'):
    sections = a.get(section), b.get(section)
    if not (isinstance(sections[0], dict) and isinstance(sections[1], dict)):
      continue
    for name, declaration in registry.declared_settings(f'config.{section}').items():
      default = json.loads(json.dumps(declaration.setting.default))
      for held, other in (sections, sections[::-1]):
        if name in held and name not in other and held[name] == default:
          del held[name]
  return a == b


def _shape_problem(data: Any) -> Optional[str]:
  """What keeps `data`, read from a ledger's JSON, from being a ledger."""
  if not isinstance(data, dict) or not isinstance(data.get('steps', {}), dict):
    return 'it is not an object with "steps"'
  for step, entry in data.get('steps', {}).items():
    if not step.isdigit() or not isinstance(entry, dict):
      return f'its entry {step!r} is not a step number with an object'
    norm = entry.get('param_norm')
    losses = entry.get('recent_losses', [])
    if (
        not isinstance(entry.get('sound', True), bool)
        or not (norm is None or isinstance(norm, numbers.Real))
        or not isinstance(losses, list)
        or not all(isinstance(loss, numbers.Real) for loss in losses)
    ):
      return f'its entry for step {step} is not a sound step record'
  diverged = data.get('diverged')
  if diverged is not None and not (
      isinstance(diverged, dict)
      and isinstance(diverged.get('config'), dict)
      and (diverged.get('step') is None or isinstance(diverged.get('step'), int))
  ):
    return 'its "diverged" is not a divergence record'
  return None


class SoundStepLedger:
  """WORKDIR/sound_steps.json: see the module docstring."""

  def __init__(self, workdir: str):
    """Reads the ledger of `workdir`, if it has one.

    Raises:
      ConfigError: the ledger cannot be read, or is not a ledger; the
        message names the file and how to go on.
    """
    self.path = run_folder.RunFolder(workdir).ledger
    self.steps: Dict[int, Dict[str, Any]] = {}
    self.diverged: Optional[Dict[str, Any]] = None
    if not storage.exists(self.path):
      return
    try:
      data = json.loads(storage.read_text(self.path))
      problem = _shape_problem(data)
    except OSError as error:
      problem = f'it cannot be read ({error.strerror})'
    except ValueError as error:  # not UTF-8 or not JSON
      problem = f'it is not JSON ({error})'
    if problem:
      raise ConfigError(
          f'{self.path} is damaged: {problem}. It records which checkpoints are sound to '
          f'go on from; move it aside (e.g. to {self.path}.damaged) to count every kept '
          'checkpoint as sound, then run the same command again.'
      )
    self.steps = {int(step): entry for step, entry in data.get('steps', {}).items()}
    self.diverged = data.get('diverged')

  def write(self) -> None:
    if jax.process_index() != 0:
      return
    data = {
        'steps': {str(step): self.steps[step] for step in sorted(self.steps)},
        'diverged': self.diverged,
    }
    storage.write_text(self.path, json.dumps(data, indent=1, sort_keys=True))

  def is_sound(self, step: int) -> bool:
    return self.steps.get(step, {}).get('sound', True)

  def why(self, step: int) -> str:
    return self.steps.get(step, {}).get('why', '')

  def newest_sound(self, kept: Sequence[int], at_most: Optional[int] = None) -> Optional[int]:
    """The newest of `kept` (at most `at_most`) that is sound, or None."""
    sound = [s for s in kept if self.is_sound(s) and (at_most is None or s <= at_most)]
    return max(sound) if sound else None

  def recent_losses(self, step: int) -> List[float]:
    return list(self.steps.get(step, {}).get('recent_losses', []))

  def record(
      self,
      step: int,
      *,
      finite: bool,
      param_norm: float,
      recent_losses: Sequence[float],
      suspect: str = '',
  ) -> None:
    """Records a step just saved; `suspect` is the spike rule's reason to
    doubt it ('' = none). Adds the other reasons (non-finite, norm)."""
    why = suspect
    if not finite:
      why = 'its parameters or optimizer state are not finite'
    else:
      earlier = [
          entry['param_norm']
          for earlier_step, entry in self.steps.items()
          if earlier_step < step and entry.get('sound', True) and 'param_norm' in entry
      ]
      if earlier and param_norm > PARAM_NORM_FACTOR * max(earlier):
        why = why or (
            f'its parameter norm {param_norm:.4g} is more than {PARAM_NORM_FACTOR:g}x the '
            f'largest of an earlier sound step ({max(earlier):.4g})'
        )
    self.steps[step] = {
        'sound': not why,
        'param_norm': param_norm if finite else None,
        'recent_losses': [float(loss) for loss in recent_losses],
    }
    if why:
      self.steps[step]['why'] = why

  def mark_suspect(self, steps: Sequence[int], why: str) -> List[int]:
    """Marks recorded sound `steps` as not sound; returns those it changed."""
    changed = []
    for step in steps:
      if self.is_sound(step):
        entry = self.steps.setdefault(step, {})
        entry['sound'] = False
        entry['why'] = why
        changed.append(step)
    return changed

  def forget(self, steps: Sequence[int]) -> None:
    """Drops steps that are no longer kept (set aside or removed)."""
    for step in steps:
      self.steps.pop(step, None)

  def keep_only(self, kept: Sequence[int]) -> None:
    self.forget([step for step in self.steps if step not in set(kept)])
