"""The error types for what the user must change.

`ConfigError` (a `ValueError`) means the user must change something: a config
field, a flag, a data path or the workdir. Its message names the field or path,
the value, and what is allowed. The command-line entry points report it as one
line with exit code 2; library callers can catch it as a ValueError.
`StorageError`, a kind of ConfigError, is a workdir whose disk is full.
"""

import errno
import os
import shutil
from typing import Union

# How TensorStore and TensorFlow word a full disk or quota (ENOSPC, EDQUOT).
_DISK_FULL_WORDS = ('No space left on device', 'Disk quota exceeded', "os_error_code='28'")


class ConfigError(ValueError):
  """A bad config value, flag, data path or workdir."""


class StorageError(ConfigError):
  """Writing into the workdir failed because its filesystem is full (or the
  quota is used up); the user must free space or move the run."""


def free_space_of(path: str) -> str:
  """'12.3 MB free' on the filesystem holding `path` (or its nearest existing
  parent), for error messages."""
  folder = os.path.abspath(path)
  while not os.path.exists(folder) and os.path.dirname(folder) != folder:
    folder = os.path.dirname(folder)
  try:
    free = shutil.disk_usage(folder).free
  except OSError:
    return 'free space unknown'
  return f'{free / 1e6:.1f} MB free'


def is_disk_full(error: Union[BaseException, str]) -> bool:
  """Whether `error` (or a message), or an error it came from, is a full disk
  or quota, as OSError or in the words TensorStore and TensorFlow use."""
  if isinstance(error, str):
    return any(words in error for words in _DISK_FULL_WORDS)
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if any(words in str(error) for words in _DISK_FULL_WORDS):
      return True
    error = error.__cause__ or error.__context__
  return False
