"""The files of saved checkpoints: integrity manifests, damaged steps, and the
steps a run protects or moves aside when it goes back. (A full disk is
`full_disk`'s; whether a step's arrays fit the arrays a run wants is
`orbax_items`'s.)

Orbax writes a step into `STEP.orbax-checkpoint-tmp` and renames it to `STEP`
once every item is written. Just before that rename (on the primary process,
after all processes finished writing), `write_manifest` records the size and
sha256 of every file under the step's item folders in `STEP/integrity.json`.
A step folder is therefore either absent, or complete with its manifest.

`inspect` reads a step folder back against its manifest. Any difference (a
missing, truncated, zeroed or bit-flipped file) makes the step damaged, and so
does a folder that is not a finished orbax step (e.g. an empty `checkpoints/9`
left by a tool or a person). A step written before manifests existed has
nothing to be checked against: it is read through once instead
(`orbax_items.unreadable_items`), and accepted as unverified when every item
reads (a truncated or missing file makes it damaged, as a manifest would).

The step-level files orbax rewrites after the rename (`_CHECKPOINT_METADATA`,
its commit timestamp, and `commit_success.txt`) are outside the manifest; the
arrays, the data-iterator state and the config are all inside it.

`StepInspector` is what every reader of a run goes through: the newest intact
step, with one warning for each newer damaged step it skips, and a step asked
for by number refused, when it is damaged, in one message that names the
first bad file, what is wrong with it and which step to read instead.

A run that is training keeps only its newest steps: a reader of its folder may
see the step it chose removed before it has read it. `pruned_if_gone` turns
whatever error that causes into `StepPruned`, and `retried_while_pruned`
chooses the newest kept step again (a bounded number of times, one warning
each); a step asked for by number is refused in one line naming the kept ones.
"""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging as python_logging
import os
import sys
import time
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, TypeVar

from absl import logging
import jax
from jax.experimental import multihost_utils

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import orbax_items
from linformer_jax.errors import ConfigError

T = TypeVar('T')

MANIFEST_FILE = 'integrity.json'
# Where a run's damaged step folders are moved, beside its checkpoints folder.
DAMAGED_FOLDER = run_folder.DAMAGED_CHECKPOINTS
# Where a run that goes back to step S moves the newer steps: DIVERGED_FOLDER/from_S.
DIVERGED_FOLDER = run_folder.DIVERGED_CHECKPOINTS
# The file in a step folder that protects it from the newest-`keep` rule
# (outside the manifest, which covers the item folders only).
PROTECTED_FILE = 'protected'
TMP_SUFFIX = '.orbax-checkpoint-tmp'
_FORMAT = 1
_STEP_METADATA = '_CHECKPOINT_METADATA'
_CHUNK_BYTES = 8 << 20
# How many steps in a row a reader chooses before it gives up, when each one
# it chose was removed (pruned by the run training there) before it was read.
PRUNED_ATTEMPTS = 5
# Orbax deletes a pruned step's files before its folder: a step folder whose
# entries change between two looks this far apart is being removed, and is
# waited for (at most _REMOVAL_WAIT_S) rather than called damaged.
_REMOVAL_POLL_S = 0.1
_REMOVAL_WAIT_S = 5.0
# What a restore that failed midway (its step pruned) leaves behind, in
# orbax's and TensorStore's words: reads still in flight report to orbax's
# closed event loop, and reads that nothing awaits any more are dropped with
# their error.
_LEFTOVER_WORDS = (
    'Event loop is closed',
    'Encountered error while reading array index',
    'in OCDBT database at',
)


@dataclasses.dataclass(frozen=True)
class Inspection:
  """What `inspect` found in one step folder.

  Attributes:
    step: the step its name gives.
    path: the step folder.
    problem: None when the step can be restored; otherwise what is wrong,
      naming the first file that differs.
    verified: whether a manifest confirmed every file (False for a step
      written before manifests existed).
  """

  step: int
  path: str
  problem: Optional[str]
  verified: bool


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with storage.open_file(path, 'rb') as f:
    while chunk := f.read(_CHUNK_BYTES):
      digest.update(chunk)
  return digest.hexdigest()


def _item_files(step_folder: str) -> List[str]:
  """Every file under the step's item folders, relative to the step folder."""
  found = []
  for entry in sorted(storage.listdir(step_folder)):
    item = os.path.join(step_folder, entry)
    if storage.isdir(item):
      found.extend(os.path.join(entry, name) for name in storage.files_under(item))
  return found


def write_manifest(step_folder: str) -> None:
  """Records the size and sha256 of every item file in STEP/integrity.json.

  Written to a temporary name, flushed and renamed, so the manifest itself is
  never half-written.
  """
  files = {}
  for relative in _item_files(step_folder):
    path = os.path.join(step_folder, relative)
    files[relative] = {'bytes': storage.getsize(path), 'sha256': _sha256(path)}
  storage.write_text(
      os.path.join(step_folder, MANIFEST_FILE),
      json.dumps({'format': _FORMAT, 'files': files}, indent=1, sort_keys=True),
  )


def recorded_bytes(step_folder: str) -> Optional[int]:
  """The total size of a sealed step's files, from its manifest (None if it
  has no readable manifest)."""
  try:
    manifest = json.loads(storage.read_text(os.path.join(step_folder, MANIFEST_FILE)))
    return sum(int(entry['bytes']) for entry in manifest['files'].values())
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _problem_against_manifest(step_folder: str) -> Optional[str]:
  try:
    files = json.loads(storage.read_text(os.path.join(step_folder, MANIFEST_FILE)))['files']
    expected = {name: (int(entry['bytes']), str(entry['sha256'])) for name, entry in files.items()}
  except (OSError, ValueError, KeyError, TypeError) as error:
    return f'its {MANIFEST_FILE} is unreadable ({error})'
  for relative, (size, sha256) in sorted(expected.items()):
    path = os.path.join(step_folder, relative)
    try:
      found_size = storage.getsize(path)
      if found_size != size:
        return f'{relative} holds {found_size} bytes, {size} were written'
      if _sha256(path) != sha256:
        return f'{relative} differs from what was written (sha256 mismatch)'
    except OSError as error:
      return f'{relative} cannot be read ({error.strerror})'
  return None


def _problem_of_unsealed(step_folder: str, items: List[str]) -> Optional[str]:
  """What makes a step folder without a manifest unusable, if anything: an
  unfinished orbax structure, or an item file that cannot be read through."""
  if not storage.isfile(os.path.join(step_folder, _STEP_METADATA)):
    return 'it is not a finished checkpoint (no _CHECKPOINT_METADATA)'
  missing = [item for item in items if not storage.isdir(os.path.join(step_folder, item))]
  if missing:
    return f'it has no {missing[0]}/ item'
  unreadable = orbax_items.unreadable_items(step_folder)
  if unreadable:
    return f'it has no {MANIFEST_FILE}, and {unreadable}'
  return None


def inspect(step_folder: str, step: int, items: List[str]) -> Inspection:
  """Checks one step folder; `items` are the item folders a checkpoint has."""
  if not storage.isdir(step_folder):
    return Inspection(step, step_folder, 'it is not a folder', verified=False)
  if storage.exists(os.path.join(step_folder, MANIFEST_FILE)):
    return Inspection(step, step_folder, _problem_against_manifest(step_folder), verified=True)
  return Inspection(step, step_folder, _problem_of_unsealed(step_folder, items), verified=False)


def step_entries(directory: str) -> Dict[int, str]:
  """The entries of a checkpoint directory named as steps: step -> path."""
  if not storage.isdir(directory):
    return {}
  steps = {}
  for name in storage.listdir(directory):
    if name.isdigit():
      steps[int(name)] = os.path.join(directory, name)
  return steps


def unknown_entries(directory: str) -> List[str]:
  """Entries of a checkpoint directory that are neither steps nor orbax's
  temporary folders."""
  if not storage.isdir(directory):
    return []
  return sorted(
      name for name in storage.listdir(directory) if not name.isdigit() and not is_temporary(name)
  )


def is_temporary(name: str) -> bool:
  """Whether a checkpoint directory's entry is orbax's temporary folder of a
  step (`STEP.orbax-checkpoint-tmp`, possibly with a suffix)."""
  return name.split('.')[0].isdigit() and TMP_SUFFIX in name


def refuse_file_at(path: str, holds: str) -> None:
  """Raises ConfigError when a plain file (or anything but a folder) is at
  local `path`, where a run keeps `holds` in a folder. Orbax meeting one
  while it saves fails in a thread that never ends."""
  if storage.is_object_store(path) or not os.path.lexists(path) or os.path.isdir(path):
    return
  raise ConfigError(
      f'{path} is a file, but the run keeps {holds} in a folder there; move the file '
      'aside or delete it, then run the same command again.'
  )


def remove_temporary_folders(directory: str) -> None:
  """Deletes the temporary folders of saves that never finished (primary
  process). Done before the run's first save and in the caller's thread, so
  a run refused just after opening its checkpoints leaves no thread behind.
  Anything else under such a name (a file) is no save's: it is moved to
  DAMAGED_FOLDER, with a warning, since orbax would delete it."""
  if jax.process_index() != 0 or not storage.isdir(directory):
    return
  for name in storage.listdir(directory):
    if not is_temporary(name):
      continue
    path = os.path.join(directory, name)
    if storage.isdir(path) and not os.path.islink(path):
      logging.info('Removing %s, a save that never finished.', name)
      storage.remove_tree(path)
    else:
      logging.warning(
          '%s is not a folder, yet it has the name of an unfinished save; moved it to %s.',
          path,
          move_aside(path),
      )


def temporary_folder(directory: str, step: int) -> str:
  """Where orbax writes `step` before renaming it into place."""
  return os.path.join(directory, f'{step}{TMP_SUFFIX}')


def move_aside(step_folder: str, destination_folder: Optional[str] = None) -> str:
  """Moves a step folder to `destination_folder`/STEP[.N] (default: a damaged
  step, to ../damaged_checkpoints); returns where it went. Nothing is deleted."""
  checkpoints = os.path.dirname(storage.location(step_folder))
  destination_folder = destination_folder or os.path.join(
      os.path.dirname(checkpoints), DAMAGED_FOLDER
  )
  refuse_file_at(destination_folder, 'the checkpoints it moves aside')
  storage.makedirs(destination_folder)
  name = os.path.basename(step_folder)
  destination = os.path.join(destination_folder, name)
  copy = 1
  while storage.exists(destination) or os.path.islink(destination):
    destination = os.path.join(destination_folder, f'{name}.{copy}')
    copy += 1
  storage.move(step_folder, destination)
  return destination


def protected_steps(directory: str) -> set:
  """The steps of a checkpoint directory marked with PROTECTED_FILE."""
  return {
      step
      for step, folder in step_entries(directory).items()
      if storage.exists(os.path.join(folder, PROTECTED_FILE))
  }


def mark_protected(directory: str, step: int, protected: bool) -> None:
  """Writes (or removes) the PROTECTED_FILE of a step folder (process 0)."""
  if jax.process_index() != 0:
    return
  path = os.path.join(directory, str(step), PROTECTED_FILE)
  # A folder of that name (made by hand) marks the step as the file does.
  if storage.isdir(path):
    if not protected:
      storage.remove_tree(path)
  elif protected:
    storage.write_text(path, 'kept from before a loss spike (training/divergence.py)\n')
  elif storage.exists(path):
    storage.remove(path)


def move_diverged_steps(directory: str, steps: List[int], back_to: int) -> None:
  """Moves the step folders `steps` of a checkpoint directory to
  ../DIVERGED_FOLDER/from_BACK_TO/ (process 0; every process waits)."""
  destination = os.path.join(os.path.dirname(directory), DIVERGED_FOLDER, f'from_{back_to}')
  if jax.process_index() == 0:
    for step in steps:
      storage.makedirs(destination)
      moved = move_aside(os.path.join(directory, str(step)), destination)
      logging.warning('Going back to step %d: moved step %d to %s.', back_to, step, moved)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('linformer_jax: newer checkpoints moved aside')


def capitalized(text: str) -> str:
  """`text` with its first letter in upper case."""
  return text[:1].upper() + text[1:]


def _entries(folder: str) -> Optional[FrozenSet[str]]:
  """The files and folders below `folder`, or None when it is gone."""
  if not storage.exists(folder):
    return None
  if not storage.isdir(folder):
    return frozenset()
  if storage.is_object_store(folder):
    return frozenset(storage.files_under(folder))
  return frozenset(
      os.path.relpath(os.path.join(root, name), folder)
      for root, folders, files in os.walk(folder)
      for name in folders + files
  )


def _removed_meanwhile(folder: str) -> bool:
  """Whether the step folder `folder` is gone, or is being removed (waiting
  for that to end): what makes a read of it fail then is its pruning, not
  damage."""
  entries = _entries(folder)
  deadline = time.monotonic() + _REMOVAL_WAIT_S
  while entries is not None and time.monotonic() < deadline:
    time.sleep(_REMOVAL_POLL_S)
    now = _entries(folder)
    if now == entries:
      return False
    entries = now
  return entries is None


def _is_leftover(error: Optional[BaseException]) -> bool:
  return error is not None and any(words in str(error) for words in _LEFTOVER_WORDS)


class _LeftoverRecords(python_logging.Filter):
  """Drops asyncio's log of a failed restore's read that nothing awaits."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    return not _is_leftover(record.exc_info[1] if record.exc_info else None)


def _quiet_failed_read_leftovers() -> None:
  """From now on, drops what a restore that failed on a pruned step leaves
  behind (`_LEFTOVER_WORDS`): Python reports each, with a traceback, through
  its unraisable-exception hook and asyncio's log, long after the failure was
  handled. Any other report passes."""
  logger = python_logging.getLogger('asyncio')
  if any(isinstance(existing, _LeftoverRecords) for existing in logger.filters):
    return
  logger.addFilter(_LeftoverRecords())
  previous = sys.unraisablehook

  def hook(unraisable) -> None:
    if not _is_leftover(unraisable.exc_value):
      previous(unraisable)

  sys.unraisablehook = hook


class StepPruned(ConfigError):
  """A step folder was removed while it was being read: the run training in
  the folder keeps only its newest steps. `what` says which step, and which
  steps are kept now."""

  def __init__(self, directory: str, step: int):
    kept = ', '.join(map(str, sorted(step_entries(directory)))) or 'none'
    self.step = step
    self.what = (
        f'the checkpoint of step {step} in {directory} was removed while it was being read '
        f'(the run writing there keeps only its newest checkpoints); the steps kept now are '
        f'{kept}'
    )
    super().__init__(f'{capitalized(self.what)}.')


@contextlib.contextmanager
def pruned_if_gone(directory: str, step: int) -> Iterator[None]:
  """Raises StepPruned in place of any error of the block (orbax's
  FileNotFoundError, TensorStore's NOT_FOUND, a JSON file cut short) when
  the folder of `step` is gone, or going, once it is raised."""
  try:
    yield
  except StepPruned:
    raise
  except Exception:
    if not _removed_meanwhile(os.path.join(directory, str(step))):
      raise
    _quiet_failed_read_leftovers()
    raise StepPruned(directory, step) from None


def listed(call: Callable[[], T], directory: str) -> T:
  """`call()`, which lists the checkpoint directory `directory` (opening an
  orbax manager on it, or reloading one), again while a step folder vanishes
  under it: orbax reads each step's metadata after listing the names, and a
  run training there removes its old steps as it saves.

  Raises:
    ConfigError: step folders vanished under PRUNED_ATTEMPTS listings in a row.
  """
  for attempt in itertools.count(1):
    try:
      return call()
    except FileNotFoundError as error:
      if attempt == PRUNED_ATTEMPTS:
        raise ConfigError(
            f'The checkpoints in {directory} cannot be listed: {error.filename} was removed '
            f'while it was listed, {PRUNED_ATTEMPTS} times in a row (the run writing there '
            'keeps only its newest checkpoints). Wait for it to finish, or copy its folder and '
            'read the copy.'
        ) from None


def retried_while_pruned(
    read: Callable[[], T], *, retry: bool, relist: Optional[Callable[[], None]] = None
) -> T:
  """`read()`, which chooses a step and reads it. With `retry` (the newest
  step was chosen, none asked for by number), a StepPruned makes it choose
  again, after `relist()` (which forgets a cached listing), with one warning
  each time, at most PRUNED_ATTEMPTS times in all; without, StepPruned is
  raised for the caller to word.

  Raises:
    StepPruned: without `retry`.
    ConfigError: PRUNED_ATTEMPTS chosen steps were each removed before they
      were read.
  """
  for attempt in itertools.count(1):
    try:
      return read()
    except StepPruned as pruned:
      if not retry:
        raise
      if attempt == PRUNED_ATTEMPTS:
        raise ConfigError(
            f'{capitalized(pruned.what)}. The newest step was removed before it was read '
            f'{PRUNED_ATTEMPTS} times in a row: the run saves faster than this reads. Wait '
            'for it to finish, or copy its folder and read the copy.'
        ) from None
      logging.warning('%s; reading the newest of them instead.', capitalized(pruned.what))
      if relist is not None:
        relist()


class _VanishedStepRecords(python_logging.Filter):
  """Drops orbax's warning about a step folder without _CHECKPOINT_METADATA,
  which it logs while listing a folder whose step is being removed (or one
  that is damaged): the inspection reports a damaged step in its own words."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    if not str(record.msg).startswith('Metadata file does not exist'):
      return True
    return not any(str(arg).endswith(_STEP_METADATA) for arg in record.args or ())


def quiet_vanished_step_logs() -> None:
  """Installs `_VanishedStepRecords` on the logger orbax writes to."""
  logger = python_logging.getLogger('absl')
  if not any(isinstance(existing, _VanishedStepRecords) for existing in logger.filters):
    logger.addFilter(_VanishedStepRecords())


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
    self._inspections: Dict[int, Inspection] = {}
    self._skipped: set = set()

  def inspection(self, step: int) -> Inspection:
    """The step's inspection, made on first use (warns if unverified).

    Raises:
      StepPruned: the step's folder was removed while it was inspected.
    """
    if step in self.trusted:
      return Inspection(step, '', None, verified=True)
    if step not in self._inspections:
      found = inspect(os.path.join(self.directory, str(step)), step, self._items)
      if found.problem is not None and _removed_meanwhile(found.path):
        raise StepPruned(self.directory, step)
      if found.problem is None and not found.verified and found.path not in _READ_UNVERIFIED:
        # Once per process: a reader's store and its partial restore each inspect.
        _READ_UNVERIFIED.add(found.path)
        logging.warning(
            'The checkpoint of step %d in %s has no %s (it was written before checkpoints '
            'were sealed); it is read unverified.',
            step,
            self.directory,
            MANIFEST_FILE,
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
        logging.warning('%s; skipped it: %s.', capitalized(self.damage(step)), instead)
    return newest

  def damaged_step(self, steps: List[int], step: int) -> Optional[str]:
    """What to tell someone who asks for `step` by number when it is
    damaged: the first bad file, what is wrong with it, and which step to
    read instead. A damaged step is either still among `steps`, or was moved
    to DAMAGED_FOLDER by the run that owns the folder. None when `step` is
    intact, or was never kept."""
    folder = os.path.join(self.directory, str(step))
    if step in steps:
      if self.inspection(step).problem is None:
        return None
      what = self.damage(step)
    else:
      moved = _moved_aside(self.directory, step)
      if moved is None:
        return None
      problem = inspect(moved, step, self._items).problem or 'it was found damaged'
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
      raise ConfigError(f'{asked_as}{damaged}.' if asked_as else f'{capitalized(damaged)}.')

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
  """The newest copy of `step` that `move_aside` put in the DAMAGED_FOLDER
  beside the checkpoint directory `directory`, or None."""
  damaged = os.path.join(os.path.dirname(directory), DAMAGED_FOLDER)
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
  for name in unknown_entries(directory):
    logging.warning('Ignoring %s in %s: it is not a checkpoint step.', name, directory)
  moved = []
  for step, path in sorted(step_entries(directory).items(), reverse=True):
    if inspector.inspection(step).problem is None:
      break
    damage = inspector.damage(step)
    if jax.process_index() == 0:
      destination = move_aside(path)
      logging.warning('%s; moved it to %s.', capitalized(damage), destination)
    moved.append(step)
    inspector.forget(step)
  if not moved:
    return
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('linformer_jax: damaged checkpoints moved aside')
  if not step_entries(directory):
    raise ConfigError(
        f'No intact checkpoint is left in {directory}: steps {sorted(moved)} were damaged and '
        f'moved to {DAMAGED_FOLDER}/ beside it. Run the same command again to start the run '
        'from step 0, or use another --workdir.'
    )
