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

Without credentials or network, those clients fail slowly and loudly (gcsfs
retries for two minutes, then raises through a page of traceback), so the
commands call `check_reachable` first: it looks for credentials and sends
one request to the store, and gives up after REACH_TIMEOUT_S. `check_paths`
does it once for all the paths a command is given, after refusing a name
that is not valid UTF-8 and a gs:// URL where only a local folder will do.
`check_folder` is the same early check for a local folder a command writes.

A refused command leaves the file system as it found it: inside
`undone_if_refused`, the folders `makedirs` creates and the files
`note_created` is told of are removed again if the block raises, unless
`keep_created` said that the command is past every check that can refuse it.
"""

import contextlib
import logging
import os
import pathlib
import re
import shutil
import tempfile
import threading
from typing import IO, Iterator, List, Mapping, Optional, Sequence, Tuple
import urllib.error
import urllib.request

from linformer_jax.errors import ConfigError

os.environ.setdefault('EPATH_USE_TF', 'false')

# pylint: disable=g-import-not-at-top,wrong-import-position
from etils import epath  # noqa: E402  (reads EPATH_USE_TF when first used)

OBJECT_STORE_SCHEMES = ('gs',)
_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')
# Google Cloud Storage's endpoint, unless $STORAGE_EMULATOR_HOST names another.
GCS_ENDPOINT = 'https://storage.googleapis.com'
EMULATOR_VARIABLE = 'STORAGE_EMULATOR_HOST'
# How long `check_reachable` waits for credentials and an answer.
REACH_TIMEOUT_S = 10.0


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
    return os.path.abspath(os.path.expanduser(path))  # `~`: the home folder
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


# What each open `undone_if_refused` block created, outermost block first.
_CREATED: List[List[str]] = []


@contextlib.contextmanager
def undone_if_refused() -> Iterator[None]:
  """Removes again, if the block raises, what was created inside it and not
  kept (`keep_created`): the files `note_created` names, newest first, and
  the local folders `makedirs` made, each only once nothing else is in it.
  So a command refused after making its workdir (and the parents that did not
  exist) or after training its tokenizer leaves the file system as it was."""
  created: List[str] = []
  _CREATED.append(created)
  try:
    yield
  except BaseException:
    for path in reversed(created):
      with contextlib.suppress(OSError):
        if is_object_store(path):
          remove(path)
        elif os.path.isdir(path) and not os.path.islink(path):
          os.rmdir(path)  # only when empty
        else:
          os.remove(path)
    raise
  finally:
    _CREATED[:] = [other for other in _CREATED if other is not created]


def note_created(path: str) -> None:
  """Records a file the command created (none was there before), for the
  open `undone_if_refused` blocks to remove if they are refused."""
  for created in _CREATED:
    created.append(path)


def keep_created() -> None:
  """Keeps what the command created so far, whatever happens next: it passed
  every check that can refuse it (e.g. a run that starts writing its own files)."""
  for created in _CREATED:
    created.clear()


def makedirs(path: str) -> None:
  """Creates a folder and its parents (on an object store: nothing to do); the
  local folders made are noted for `undone_if_refused`."""
  if is_object_store(path):
    _remote(path).mkdir(parents=True, exist_ok=True)
    return
  missing = []
  folder = os.path.abspath(path)
  while not os.path.exists(folder) and os.path.dirname(folder) != folder:
    missing.append(folder)
    folder = os.path.dirname(folder)
  try:
    os.makedirs(path, exist_ok=True)
  finally:  # also the parents made before a deeper folder failed
    for folder in reversed(missing):
      if os.path.isdir(folder):
        note_created(folder)


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


@contextlib.contextmanager
def staged_folder(target: pathlib.Path, purpose: str) -> Iterator[pathlib.Path]:
  """A local folder written whole or not at all: yields a staging folder beside
  `target` (named for `purpose`, e.g. 'exporting'), renamed onto `target` (absent
  or empty) when the block ends, removed when it raises."""
  staging = target.with_name(f'.{target.name}.{purpose}{os.getpid()}')
  shutil.rmtree(staging, ignore_errors=True)
  try:
    staging.mkdir(parents=True)
    yield staging
    if target.is_dir():
      target.rmdir()  # empty (checked by the caller): the rename needs it gone
    os.rename(staging, target)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def read_text(path: str) -> str:
  if is_object_store(path):
    return _remote(path).read_text()
  with open(path) as f:
    return f.read()


def check_folder(path: str, flag: str = '--workdir', *, writable: bool = True) -> None:
  """Raises ConfigError unless local `path` is a folder, or nothing is there
  yet and a folder can be made, and (with `writable`) files can be created
  in it. A folder still to be made is judged by its nearest existing parent.

  Creating a file (removed at once) is the only test that sees read-only
  mounts, permissions and ACLs alike. Nothing else is created; gs:// paths
  pass (see `check_reachable`).
  """
  if is_object_store(path):
    return
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    what = 'a file' if existing == os.path.abspath(path) else f'inside the file {existing}'
    raise ConfigError(
        f'{flag}={path!r} cannot be a folder (it is {what}); give the path of a folder.'
    )
  if not writable:
    return
  try:
    handle, probe = tempfile.mkstemp(prefix='.write-test-', dir=existing)
  except OSError as error:
    where = '' if existing == os.path.abspath(path) else f': its parent {existing} is not'
    raise ConfigError(
        f'{flag}={path!r} is not writable{where} ({error.strerror}); give the path of a folder '
        'you can write to.'
    ) from None
  os.close(handle)
  os.remove(probe)


def _endpoint() -> Tuple[str, bool]:
  """(URL, is_emulator) of the object store the clients will use."""
  emulator = os.environ.get(EMULATOR_VARIABLE, '')
  if not emulator:
    return GCS_ENDPOINT, False
  return (emulator if '://' in emulator else f'http://{emulator}').rstrip('/'), True


def _what_to_check(emulator: bool) -> str:
  return f'${EMULATOR_VARIABLE}' if emulator else 'the network'


def _credentials_problem() -> str:
  """'' when Google's default credentials are found, else what is missing."""
  import google.auth  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top

  # Its warning that no project is set would be a second line: the store's
  # paths name their bucket, so no project is needed.
  auth_log = logging.getLogger('google.auth._default')
  level = auth_log.level
  auth_log.setLevel(logging.ERROR)
  try:
    google.auth.default()
  except exceptions.DefaultCredentialsError as error:
    # Its first argument (sometimes a tuple of a message and the error
    # behind it), first sentence: the rest is a web link.
    reason = error.args[0] if error.args else str(error)
    reason = str(reason[0] if isinstance(reason, tuple) else reason)
    return reason.split('. ')[0].rstrip('.')
  finally:
    auth_log.setLevel(level)
  return ''


def _reach_problem(url: str, emulator: bool, timeout_s: float) -> str:
  """What keeps this process from the store at `url`, and what to do about
  it; '' when nothing does. Any HTTP answer counts as reached (without
  credentials the store answers 401)."""
  if not emulator:
    missing = _credentials_problem()
    if missing:
      return (
          f'no Google Cloud credentials ({missing}): run `gcloud auth application-default login` '
          'or set GOOGLE_APPLICATION_CREDENTIALS to a key file'
      )
  try:
    urllib.request.urlopen(f'{url}/storage/v1/b', timeout=timeout_s).close()
  except urllib.error.HTTPError:
    pass
  except (urllib.error.URLError, OSError) as error:
    reason = getattr(error, 'reason', error)
    reason = getattr(reason, 'strerror', None) or str(reason) or type(reason).__name__
    return f'{url} cannot be reached ({reason}): check {_what_to_check(emulator)}'
  return ''


def _not_utf8(path: str) -> str:
  """'' when `path` is valid UTF-8, else `path` with each byte that is not
  written as \\xNN. A name of other bytes reaches Python as surrogates (PEP 383)."""
  try:
    path.encode('utf-8')
    return ''
  except UnicodeEncodeError:
    pass
  try:
    return path.encode('utf-8', 'surrogateescape').decode('utf-8', 'backslashreplace')
  except UnicodeEncodeError:  # a surrogate that stands for no byte
    return path.encode('utf-8', 'backslashreplace').decode()


def check_name(path: str, setting: str) -> None:
  """Refuses a path that is not valid UTF-8 (TensorStore, JSON and the event
  files take text paths only), in one line naming `setting`."""
  shown = _not_utf8(path)
  if shown:
    raise ConfigError(
        f"{setting}='{shown}' is not a valid UTF-8 name, and the libraries a run uses take "
        f'UTF-8 paths only; rename the folder or file, or choose another {setting}.'
    )


def check_paths(
    paths: Sequence[Tuple[str, str]],
    local: Optional[Mapping[str, str]] = None,
    timeout_s: Optional[float] = None,
) -> None:
  """Refuses, in one ConfigError naming its setting, the first path a run
  could not use, before anything reads or writes it.

  `paths` holds (setting, path) pairs, e.g. ('--workdir', 'runs/a') or
  ('config.init_from', 'gs://b/run'); an empty path is none and passes.
  Refused: a name that is not valid UTF-8 (TensorStore, JSON and the event
  files take text paths only); a URL in a setting of `local` (setting -> what
  to give instead), which is read as a local folder; a URL of another scheme
  than gs://, or without a bucket (`location`). Then, when any path is on the
  object store, the store is checked once (`check_reachable`), naming the
  first setting that holds one.
  """
  local = local or {}
  remote = []
  for setting, path in paths:
    if not path:
      continue
    check_name(path, setting)
    if not scheme_of(path):
      continue
    if setting in local:
      raise ConfigError(f'{setting}={path!r} names an object store; {local[setting]}.')
    remote.append((setting, location(path, setting)))
  if remote:
    setting, path = remote[0]
    check_reachable(path, setting, timeout_s)


def check_reachable(path: str, flag: str = '--workdir', timeout_s: Optional[float] = None) -> None:
  """Raises ConfigError, within about `timeout_s` (REACH_TIMEOUT_S), unless
  the object store of `path` can be used: credentials are found (an emulator
  needs none) and its endpoint answers a request. Local paths pass.
  """
  if not is_object_store(path):
    return
  timeout_s = REACH_TIMEOUT_S if timeout_s is None else timeout_s
  url, emulator = _endpoint()
  found = []
  # In a thread, so that a name lookup that hangs (no DNS server) cannot hold
  # the command past the deadline; a daemon, left behind when the command exits.
  worker = threading.Thread(
      target=lambda: found.append(_reach_problem(url, emulator, timeout_s)),
      daemon=True,
  )
  worker.start()
  worker.join(timeout_s)
  if not found:
    found.append(f'{url} gave no answer within {timeout_s:g} s: check {_what_to_check(emulator)}')
  if found[0]:
    raise ConfigError(f'{flag}={path}: {found[0]}, or give a local {flag}.')
