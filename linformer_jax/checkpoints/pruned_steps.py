"""A step removed while it is read. A run that is training keeps only its
newest steps: a reader of its folder may see the step it chose removed before
it has read it, or a step folder vanish while it lists them.

`pruned_if_gone` turns whatever error that causes into `StepPruned`, and
`retried_while_pruned` chooses the newest kept step again (a bounded number of
times, one warning each); a step asked for by number is refused in one line
naming the kept ones. `listed` lists a checkpoint directory again while a step
folder vanishes under it. Orbax deletes a pruned step's files before its
folder: `removed_meanwhile` tells such a folder from a damaged one.
"""

import contextlib
import itertools
import logging as python_logging
import os
import sys
import time
from typing import Callable, FrozenSet, Iterator, Optional, TypeVar

from absl import logging

from linformer_jax import storage
from linformer_jax.checkpoints import step_files
from linformer_jax.errors import ConfigError

T = TypeVar('T')

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


def removed_meanwhile(folder: str) -> bool:
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
    kept = ', '.join(map(str, sorted(step_files.step_entries(directory)))) or 'none'
    self.step = step
    self.what = (
        f'the checkpoint of step {step} in {directory} was removed while it was being read '
        f'(the run writing there keeps only its newest checkpoints); the steps kept now are '
        f'{kept}'
    )
    super().__init__(f'{step_files.capitalized(self.what)}.')


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
    if not removed_meanwhile(os.path.join(directory, str(step))):
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
            f'{step_files.capitalized(pruned.what)}. The newest step was removed before it was '
            f'read {PRUNED_ATTEMPTS} times in a row: the run saves faster than this reads. Wait '
            'for it to finish, or copy its folder and read the copy.'
        ) from None
      logging.warning(
          '%s; reading the newest of them instead.', step_files.capitalized(pruned.what)
      )
      if relist is not None:
        relist()
