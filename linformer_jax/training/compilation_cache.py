"""JAX's persistent compilation cache, from `config.compilation_cache_dir`.

A command compiles its train and eval steps before the first step; with the
cache, a resumed or repeated run with the same model, mesh and JAX version
loads them from disk instead (docs/training.md, "Compilation cache", gives the
time saved). JAX decides once per process, at its first compile, which folder
it uses, so `use_config_cache` runs before anything is compiled: `cli.run`
calls it for every command that has a --config.

An empty field leaves JAX's own settings alone, so $JAX_COMPILATION_CACHE_DIR
(which the test suite sets for its session) still applies.
"""

import os
from typing import Optional

import jax
import ml_collections

from linformer_jax.errors import ConfigError

# Programs that compile faster than this are not written: the progress-line and
# learning-rate helpers compile in milliseconds, and reading a file back costs
# about as much. The train and eval steps of every config here take longer.
MIN_COMPILE_TIME_SECS = 0.5
# No size floor: the compile-time floor already drops the small programs, and
# -1 keeps JAX from raising it for a filesystem it guesses is remote.
MIN_ENTRY_SIZE_BYTES = -1
THRESHOLDS = {
    'jax_persistent_cache_min_compile_time_secs': MIN_COMPILE_TIME_SECS,
    'jax_persistent_cache_min_entry_size_bytes': MIN_ENTRY_SIZE_BYTES,
}


def cache_folder(setting: str, workdir: str) -> str:
  """The folder `setting` names: a URL (gs://...) or an absolute path as it
  is, `~` expanded, and a relative path inside `workdir`."""
  if '://' in setting:
    return setting
  setting = os.path.expanduser(setting)
  if os.path.isabs(setting) or not workdir:
    return os.path.abspath(setting)
  if '://' in workdir:
    return f"{workdir.rstrip('/')}/{setting}"
  return os.path.abspath(os.path.join(workdir, setting))


def _make_local_folder(folder: str) -> None:
  """Creates `folder`, or raises ConfigError naming the field to change."""
  problem = None
  try:
    os.makedirs(folder, exist_ok=True)
  except FileExistsError:
    problem = 'a file, not a folder'
  except OSError as error:
    problem = f'not a folder this process can create ({error.strerror})'
  if problem is None and not os.access(folder, os.W_OK | os.X_OK):
    problem = 'not writable'
  if problem:
    raise ConfigError(
        f'config.compilation_cache_dir: {folder} is {problem}; name a writable folder, '
        "or --config.compilation_cache_dir='' for no cache."
    )


def use_config_cache(config: ml_collections.ConfigDict, workdir: str) -> Optional[str]:
  """Points JAX's compilation cache at config.compilation_cache_dir (resolved
  by `cache_folder`), creating a local folder, and returns that folder; None
  (and JAX's settings untouched) when the field is empty or absent.

  The thresholds above apply unless their JAX_* environment variables are set.

  Raises:
    ConfigError: the field is not a string, or names a local path that is a
      file or cannot be created or written.
  """
  setting = config.compilation_cache_dir
  if not isinstance(setting, str):
    raise ConfigError(
        f'config.compilation_cache_dir={setting!r} is not allowed: use a folder path, '
        "or '' for no cache."
    )
  if not setting:
    return None
  folder = cache_folder(setting, workdir)
  if '://' not in folder:
    _make_local_folder(folder)
  for name, value in THRESHOLDS.items():
    if name.upper() not in os.environ:
      jax.config.update(name, value)
  jax.config.update('jax_compilation_cache_dir', folder)
  return folder
