"""The data cache folder: extracted corpora, prepared splits, generated ListOps.

`cache_root` says where it is: config.data.cache_dir if set, else
$LINFORMER_JAX_CACHE_DIR, else ~/.cache/linformer_jax.
"""

import os
import pathlib
from typing import Optional

from linformer_jax import storage
from linformer_jax.errors import ConfigError

DEFAULT_CACHE_DIR = '~/.cache/linformer_jax'
# Environment variable that moves the default cache (config.data.cache_dir
# still wins): the test suite points it at a fresh folder.
CACHE_DIR_VARIABLE = 'LINFORMER_JAX_CACHE_DIR'
# What to give instead of a gs:// cache: its files are read and written as
# local files (ArrayRecord and SentencePiece take local paths only).
LOCAL_ONLY = (
    'the data cache is a folder on this machine: give a local folder (prepared splits are '
    'shared through gs:// with config.data.prepared_dir)'
)


def cache_root(cache_dir: Optional[str] = None) -> pathlib.Path:
  """The cache folder: `cache_dir` if set, else $LINFORMER_JAX_CACHE_DIR, else
  ~/.cache/linformer_jax.

  Checked, not created: it must be a local folder that can be written, or one
  that can be made (the first existing folder on its path can be written).

  Raises:
    ConfigError: it cannot be the cache; the message names the path and the
      setting it came from.
  """
  if cache_dir:
    setting = f'config.data.cache_dir={cache_dir!r}'
    fix = 'set config.data.cache_dir to a folder you can write to'
  elif os.environ.get(CACHE_DIR_VARIABLE):
    setting = f'${CACHE_DIR_VARIABLE}={os.environ[CACHE_DIR_VARIABLE]!r}'
    fix = f'point ${CACHE_DIR_VARIABLE} at a folder you can write to, or set config.data.cache_dir'
  else:
    setting = f'the default data cache {DEFAULT_CACHE_DIR}'
    fix = f'set config.data.cache_dir or ${CACHE_DIR_VARIABLE} to a folder you can write to'
  given = cache_dir or os.environ.get(CACHE_DIR_VARIABLE) or DEFAULT_CACHE_DIR
  if storage.is_object_store(given):
    raise ConfigError(f'{setting} names an object store; {LOCAL_ONLY}.')
  root = pathlib.Path(os.path.expanduser(given))
  existing = root
  while not os.path.lexists(existing) and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    where = '' if existing == root else f', and {root} would lie inside it'
    problem = f'{existing} is a file, not a folder{where}'
  elif not os.access(existing, os.W_OK | os.X_OK):
    problem = f'{existing} is a folder you cannot write to'
  else:
    return root
  raise ConfigError(f'{setting} cannot be the data cache: {problem}; {fix}.')
