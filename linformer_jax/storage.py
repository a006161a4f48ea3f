"""Where a run's files live: local folders, or Google Cloud Storage (gs://).

Every path a run writes or reads (workdir files, checkpoints' manifests,
prepared data) goes through these functions. A local path is handled with
`os`, exactly as before; a `gs://BUCKET/PATH` with `etils.epath` over gcsfs
(fsspec). Orbax and TensorStore take gs:// paths themselves.

An object store has no folders, renames or appends: a "folder" is a prefix
that exists while an object lies under it, a rename is a copy and a delete,
and an object is written whole (a reader sees the old object or the new one,
never half), so a single write is already atomic there.

gcsfs reads the usual Google credentials; `STORAGE_EMULATOR_HOST` points it
at an emulator (the tests start one). TensorFlow's own gs:// client (which
epath would otherwise use) cannot be pointed at an emulator, so epath is told
to use gcsfs.
"""

import os
import re
import shutil
from typing import IO, List

from linformer_jax.errors import ConfigError

os.environ.setdefault('EPATH_USE_TF', 'false')

# pylint: disable=g-import-not-at-top,wrong-import-position
from etils import epath  # noqa: E402  (reads EPATH_USE_TF when first used)

OBJECT_STORE_SCHEMES = ('gs',)
_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')


def scheme_of(path: str) -> str:
  """'gs' for 'gs://b/x', '' for a local path."""
  match = _SCHEME.match(os.fspath(path))
  return match.group(1).lower() if match else ''


def is_object_store(path: str) -> bool:
  return scheme_of(path) in OBJECT_STORE_SCHEMES


def location(path: str, flag: str = '--workdir') -> str:
  """`path` as the run will use it: local paths made absolute, gs:// URLs kept.

  Raises:
    ConfigError: an empty path, a URL of any other scheme, or a gs:// URL
      without a bucket.
  """
  path = os.fspath(path)
  if not path:
    raise ConfigError(f"{flag}='' cannot be a run folder (it is empty); give the path of a folder.")
  scheme = scheme_of(path)
  if not scheme:
    return os.path.abspath(path)
  if scheme not in OBJECT_STORE_SCHEMES:
    raise ConfigError(
        f'{flag}={path!r}: {scheme}:// is not a supported storage; use a local path or '
        'gs://BUCKET/PATH.'
    )
  bucket = path[len(scheme) + 3 :].split('/')[0]
  if not bucket:
    raise ConfigError(f'{flag}={path!r} names no bucket; use gs://BUCKET/PATH.')
  return path.rstrip('/')


def join(path: str, *names: str) -> str:
  return os.path.join(path, *names)


def _remote(path: str) -> epath.Path:
  return epath.Path(path)


def exists(path: str) -> bool:
  return _remote(path).exists() if is_object_store(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _remote(path).is_dir() if is_object_store(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  if is_object_store(path):
    return _remote(path).is_file()
  return os.path.isfile(path)


def listdir(path: str) -> List[str]:
  """The names in a folder (on an object store: under the prefix PATH/)."""
  if is_object_store(path):
    return [child.name for child in _remote(path).iterdir()]
  return os.listdir(path)


def getsize(path: str) -> int:
  if is_object_store(path):
    return int(_remote(path).stat().length)
  return os.path.getsize(path)


def makedirs(path: str) -> None:
  """Creates a folder and its parents (on an object store: nothing to do)."""
  if is_object_store(path):
    _remote(path).mkdir(parents=True, exist_ok=True)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  if is_object_store(path):
    _remote(path).unlink()
  else:
    os.remove(path)


def remove_tree(path: str) -> None:
  """Deletes a folder and everything under it."""
  if is_object_store(path):
    _remote(path).rmtree()
  else:
    shutil.rmtree(path)


def move(source: str, destination: str) -> None:
  """Moves a file or folder (on an object store: copies, then deletes)."""
  if is_object_store(source):
    _remote(source).rename(destination)
  else:
    shutil.move(source, destination)


def open_file(path: str, mode: str = 'r') -> IO:
  if is_object_store(path):
    return _remote(path).open(mode)
  return open(path, mode)  # pylint: disable=unspecified-encoding


def copy_file(source: str, destination: str) -> None:
  """Copies one file, local or remote to local or remote, in 8 MiB chunks.

  A local destination is written under a temporary name and renamed; an
  object is written whole by the store itself.
  """
  target = destination if is_object_store(destination) else f'{destination}.partial{os.getpid()}'
  with open_file(source, 'rb') as reader, open_file(target, 'wb') as writer:
    while chunk := reader.read(8 << 20):
      writer.write(chunk)
  if target != destination:
    os.replace(target, destination)


def files_under(folder: str) -> List[str]:
  """Every file below `folder`, as paths relative to it, sorted."""
  if not is_object_store(folder):
    return sorted(
        os.path.relpath(os.path.join(base, name), folder)
        for base, _, names in os.walk(folder)
        for name in names
    )
  found = []
  for name in listdir(folder):
    path = join(folder, name)
    if isdir(path):
      found.extend(join(name, below) for below in files_under(path))
    else:
      found.append(name)
  return sorted(found)


def write_text(path: str, text: str) -> None:
  """Writes `path` whole or not at all: a failed write (a full disk) leaves
  any previous file as it was.

  Locally the text goes to PATH.partial, is flushed to disk and renamed; an
  object store writes an object whole by itself.
  """
  if is_object_store(path):
    _remote(path).write_text(text)
    return
  partial = path + '.partial'
  try:
    with open(partial, 'w') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(partial, path)
  except OSError as error:
    try:
      os.remove(partial)
    except OSError:
      pass
    raise OSError(error.errno, error.strerror, path) from None


def read_text(path: str) -> str:
  if is_object_store(path):
    return _remote(path).read_text()
  with open(path) as f:
    return f.read()
