"""The files of saved checkpoints: integrity manifests, the steps a run
protects, and the steps it moves aside, damaged or left behind when it goes
back. (Which step a reader reads, damaged ones skipped, is `damaged_steps`'s; a
step removed while it is read, `pruned_steps`'s; a full disk, `full_disk`'s;
whether a step's arrays fit the arrays a run wants, `orbax_items`'s.)

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
"""

import dataclasses
import hashlib
import json
import logging as python_logging
import os
from typing import Dict, List, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import orbax_items
from linformer_jax.errors import ConfigError

MANIFEST_FILE = 'integrity.json'
# The file in a step folder that protects it from the newest-`keep` rule
# (outside the manifest, which covers the item folders only).
PROTECTED_FILE = 'protected'
TMP_SUFFIX = '.orbax-checkpoint-tmp'
_FORMAT = 1
_STEP_METADATA = '_CHECKPOINT_METADATA'
_CHUNK_BYTES = 8 << 20


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
  ../damaged_checkpoints, with a warning, since orbax would delete it."""
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
  destination_folder = (
      destination_folder or run_folder.RunFolder(os.path.dirname(checkpoints)).damaged_checkpoints
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
  ../diverged_checkpoints/from_BACK_TO/ (process 0; every process waits)."""
  diverged = run_folder.RunFolder(os.path.dirname(directory)).diverged_checkpoints
  destination = os.path.join(diverged, f'from_{back_to}')
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
