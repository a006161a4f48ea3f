"""A full disk under a run's checkpoints: foreseen before a save, reported in
one line when a save meets it.

Before each save the store asks `room_shortfall` whether the next checkpoint
fits: about as many bytes as the newest sealed step took (its manifest's
sizes, `step_files.recorded_bytes`), or the state's arrays before there is
one, with some to spare. A save that meets a full disk anyway (in orbax's
background thread) becomes one line, `full_disk_message`, naming the step the
run resumes from once there is room; `quiet_disk_full_logs` keeps orbax's own
log records of the failure, each with a traceback, off the console.
"""

import logging as python_logging
import os
import shutil
from typing import Any, List, Optional

import jax

from linformer_jax import storage
from linformer_jax.checkpoints import step_files
from linformer_jax.errors import free_space_of
from linformer_jax.errors import is_disk_full


class _DiskFullRecords(python_logging.Filter):
  """Drops log records about a full disk (orbax logs one per failed write,
  with its traceback, from its background threads); the run reports the
  failure itself, in one line."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and is_disk_full(error):
      return False
    return not is_disk_full(str(record.msg))


def quiet_disk_full_logs() -> None:
  """Installs `_DiskFullRecords` on the loggers orbax and asyncio write to."""
  for name in ('absl', 'asyncio'):
    logger = python_logging.getLogger(name)
    if not any(isinstance(existing, _DiskFullRecords) for existing in logger.filters):
      logger.addFilter(_DiskFullRecords())


def room_shortfall(directory: str, steps: List[int], state: Any) -> Optional[int]:
  """The bytes a new checkpoint needs if the disk lacks room for it, else None.

  A checkpoint takes about what the newest sealed one of `steps` took, or,
  before there is one, the arrays of `state`; 10% and 1 MiB are kept spare.
  """
  if storage.is_object_store(directory):
    return None  # no disk of this machine's to fill
  needed = None
  for step in sorted(steps, reverse=True):
    needed = step_files.recorded_bytes(os.path.join(directory, str(step)))
    if needed:
      break
  if not needed:
    needed = sum(getattr(leaf, 'nbytes', 0) for leaf in jax.tree_util.tree_leaves(state))
  folder = directory if os.path.isdir(directory) else os.path.dirname(directory)
  try:
    free = shutil.disk_usage(folder).free
  except OSError:
    return None
  return needed if free < needed * 1.1 + (1 << 20) else None


def full_disk_message(directory: str, step: int, kept: List[int], need: str = '') -> str:
  """The one line saying that saving `step` failed on a full disk, and where
  the run resumes once there is room."""
  kept = [other for other in kept if other != step]
  resume = f' from step {kept[-1]}' if kept else ''
  need = f'; {need}' if need else ''
  return (
      f'Cannot save the checkpoint of step {step} in {directory}: the disk is full '
      f'({free_space_of(directory)}{need}). Free space or move the workdir to a larger disk, '
      f'then run the same command to resume{resume}.'
  )
