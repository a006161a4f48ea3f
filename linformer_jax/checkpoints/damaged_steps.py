"""Which step of a checkpoint directory a reader reads, and what becomes of
the damaged ones (`step_files.inspect` says which are).

`StepInspector` is what every reader of a run goes through: the newest intact
step, with one warning for each newer damaged step it skips, and a step asked
for by number refused, when it is damaged, in one message that names the
first bad file, what is wrong with it and which step to read instead. A step
whose folder is being removed while it is inspected (the run training there
pruned it) is not damaged: it raises `pruned_steps.StepPruned`. The run that
owns the folder moves the steps newer than its newest intact one aside
(`set_aside_damaged_steps`).
"""

import os
from typing import Dict, List, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import pruned_steps
from linformer_jax.checkpoints import step_files
from linformer_jax.errors import ConfigError

# The step folders without a manifest already warned about.
_READ_UNVERIFIED: set = set()


class StepInspector:
  """Which steps of a checkpoint directory can be read, each inspected once.

  A step saved by this process's store is trusted as soon as orbax accepted
  it; every other step is checked against its manifest before first use.
  """

  def __init__(self, directory: str, items: List[str]):
    """Inspects nothing yet.

    Args:
      directory: a checkpoint directory.
      items: the item folders every step of it has.
    """
    self.directory = directory
    self._items = items
    self.trusted: set = set()
    self._inspections: Dict[int, step_files.Inspection] = {}
    self._skipped: set = set()

  def inspection(self, step: int) -> step_files.Inspection:
    """The step's inspection, made on first use (warns if unverified).

    Raises:
      StepPruned: the step's folder was removed while it was inspected.
    """
    if step in self.trusted:
      return step_files.Inspection(step, '', None, verified=True)
    if step not in self._inspections:
      found = step_files.inspect(os.path.join(self.directory, str(step)), step, self._items)
      if found.problem is not None and pruned_steps.removed_meanwhile(found.path):
        raise pruned_steps.StepPruned(self.directory, step)
      if found.problem is None and not found.verified and found.path not in _READ_UNVERIFIED:
        # Once per process: a reader's store and its partial restore each inspect.
        _READ_UNVERIFIED.add(found.path)
        logging.warning(
            'The checkpoint of step %d in %s has no %s (it was written before checkpoints '
            'were sealed); it is read unverified.',
            step,
            self.directory,
            step_files.MANIFEST_FILE,
        )
      self._inspections[step] = found
    return self._inspections[step]

  def forget(self, step: int) -> None:
    self._inspections.pop(step, None)
    self.trusted.discard(step)
    self._skipped.discard(step)

  def damage(self, step: int) -> str:
    """'the checkpoint of step S in DIR is damaged (what is wrong)'."""
    return (
        f'the checkpoint of step {step} in {self.directory} is damaged '
        f'({self.inspection(step).problem})'
    )

  def _newest_intact(self, steps: List[int]) -> Optional[int]:
    return next(
        (step for step in sorted(steps, reverse=True) if self.inspection(step).problem is None),
        None,
    )

  def newest_intact(self, steps: List[int]) -> Optional[int]:
    """The newest intact step of `steps`, None if none is; warns once, in
    one line, about each newer damaged step it skips."""
    newest = self._newest_intact(steps)
    for step in sorted(steps, reverse=True):
      if step == newest:
        break
      if step not in self._skipped:
        self._skipped.add(step)
        instead = (
            f'step {newest}, the newest intact one, is read instead'
            if newest is not None
            else 'no older step is intact'
        )
        logging.warning('%s; skipped it: %s.', step_files.capitalized(self.damage(step)), instead)
    return newest

  def damaged_step(self, steps: List[int], step: int) -> Optional[str]:
    """What to tell someone who asks for `step` by number when it is
    damaged: the first bad file, what is wrong with it, and which step to
    read instead. A damaged step is either still among `steps`, or was moved
    to the damaged_checkpoints folder by the run that owns the folder. None
    when `step` is intact, or was never kept."""
    folder = os.path.join(self.directory, str(step))
    if step in steps:
      if self.inspection(step).problem is None:
        return None
      what = self.damage(step)
    else:
      moved = _moved_aside(self.directory, step)
      if moved is None:
        return None
      problem = step_files.inspect(moved, step, self._items).problem or 'it was found damaged'
      what = (
          f'the checkpoint of step {step} in {self.directory} is damaged ({problem}); '
          f'the run on this folder moved it to {moved}'
      )
    newest = self._newest_intact([kept for kept in steps if kept != step])
    if newest is None:
      return f'{what}; no other kept step is intact'
    if step not in steps or newest > step:
      return f'{what}; use step {newest}, the newest intact one, instead'
    return (
        f'{what}; use step {newest}, the newest intact one, instead, or delete {folder} '
        f'so that step {newest} is the newest'
    )

  def refuse_damaged(self, steps: List[int], step: int, asked_as: str = '') -> None:
    """Raises ConfigError with `damaged_step`'s message (after `asked_as`,
    e.g. 'config.restore_step=3: ') when `step` is damaged."""
    damaged = self.damaged_step(steps, step)
    if damaged:
      raise ConfigError(
          f'{asked_as}{damaged}.' if asked_as else f'{step_files.capitalized(damaged)}.'
      )

  def step_to_read(self, steps: List[int], step: Optional[int]) -> int:
    """`step`, or the newest intact one when None (`newest_intact`).

    Raises:
      ConfigError: `step` is damaged (`damaged_step`'s message) or not kept,
        or no step is intact.
    """
    if step is not None:
      self.refuse_damaged(steps, step)
      if step not in steps:
        raise ConfigError(
            f'{self.directory} holds no checkpoint of step {step}; '
            f'it holds steps {sorted(steps)}.'
        )
      return step
    newest = self.newest_intact(steps)
    if newest is not None:
      return newest
    if steps:
      raise ConfigError(f'Every checkpoint in {self.directory} is damaged; see the warnings above.')
    raise ConfigError(f'{self.directory} holds no checkpoint.')


def _moved_aside(directory: str, step: int) -> Optional[str]:
  """The newest copy of `step` that `step_files.move_aside` put in the
  damaged_checkpoints folder beside the checkpoint directory `directory`, or
  None."""
  damaged = run_folder.RunFolder(os.path.dirname(directory)).damaged_checkpoints
  if not storage.isdir(damaged):
    return None
  copies = {}
  for name in storage.listdir(damaged):
    number, _, copy = name.partition('.')
    if number == str(step) and (not copy or copy.isdigit()):
      copies[int(copy or 0)] = os.path.join(damaged, name)
  return copies[max(copies)] if copies else None


def set_aside_damaged_steps(inspector: StepInspector) -> None:
  """Moves the step folders newer than the newest intact step of a run to
  its damaged_checkpoints folder, warning about each (and about entries that
  are not steps, which stay). Called by the run holding the workdir's lock.

  Raises:
    ConfigError: step folders were found, but none is intact.
  """
  directory = inspector.directory
  for name in step_files.unknown_entries(directory):
    logging.warning('Ignoring %s in %s: it is not a checkpoint step.', name, directory)
  moved = []
  for step, path in sorted(step_files.step_entries(directory).items(), reverse=True):
    if inspector.inspection(step).problem is None:
      break
    damage = inspector.damage(step)
    if jax.process_index() == 0:
      destination = step_files.move_aside(path)
      logging.warning('%s; moved it to %s.', step_files.capitalized(damage), destination)
    moved.append(step)
    inspector.forget(step)
  if not moved:
    return
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('linformer_jax: damaged checkpoints moved aside')
  if not step_files.step_entries(directory):
    raise ConfigError(
        f'No intact checkpoint is left in {directory}: steps {sorted(moved)} were damaged and '
        f'moved to {run_folder.DAMAGED_CHECKPOINTS}/ beside it. Run the same command again to '
        'start the run from step 0, or use another --workdir.'
    )
