"""config.extensions: the files and modules of a user's own parts, imported.

Importing a file runs its `register` calls, so that its parts (projections,
attention kinds, pretraining sources, tasks: `registry`) become names a config
may use. Every command imports `config.extensions` before the config is
checked; `import_command_extensions` imports those a command line names before
the --config.X overrides are typed, and adds the settings their parts declare
(`registry.add_declared_settings`), so that --config.model.NAME=VALUE parses
for a setting of an extension. A file is imported once per process, and not
again when a normal `import` has imported it already.

A run keeps what it needs to load from anywhere: its config.json names each
file by its absolute path (`saved_entries`), and WORKDIR/extensions/ holds a
copy of each file (`keep_copies`). `import_run_extensions` imports a run's
files: the original where it is still there and unchanged, the run's copy
where it moved or changed.
"""

import ast
import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from absl import flags
from ml_collections.config_flags import tuple_parser

from linformer_jax import registry
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import ConfigError


def import_command_extensions(config: Any, argv: Sequence[str]) -> None:
  """Imports the extensions a command line names and adds the settings their
  parts declare to the command's config.

  For a command's config file, loaded but not yet locked: the --config.X
  overrides are typed against the config after this, so that
  --config.model.temperature_init=2.0 parses once the file declaring it is
  imported. The extensions are `config.extensions`, or those of the
  --config.extensions overrides in argv (flag files read), as ml_collections
  will set them.

  Raises:
    ConfigError: as `import_extensions`.
  """
  overrides = _extension_overrides(flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False))
  import_extensions(config.extensions if overrides is None else overrides)
  registry.add_declared_settings(config)


def flag_arguments(argv: Sequence[str], name: str) -> List[str]:
  """The values argv (a command line, flag files already read) gives flag
  --NAME, as --NAME=VALUE or --NAME VALUE, in order; none after `--`."""
  values = []
  arguments = iter(argv[1:])
  for argument in arguments:
    if argument == '--':
      break
    flag, has_value, value = argument.partition('=')
    if flag.startswith('-') and flag.lstrip('-') == name:
      values.append(value if has_value else next(arguments, ''))
  return values


def _extension_overrides(argv: Sequence[str]) -> Optional[Tuple[Any, ...]]:
  """The --config.extensions values in argv, joined as ml_collections joins
  repeated ones, or None when it has none.

  Raises:
    ConfigError: a value that is not a tuple (ml_collections would take a
      bare path as a tuple of one, where Python refuses a string).
  """
  values = flag_arguments(argv, 'config.extensions')
  if not values:
    return None
  for value in values:
    try:
      parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      parsed = value  # a bare path
    if not isinstance(parsed, (tuple, list)):
      raise ConfigError(
          f'--config.extensions={value} is a string, not a tuple; pass a tuple of files or '
          f'module names, e.g. --config.extensions="({str(parsed)!r},)".'
      )
  parser = tuple_parser.TupleParser()
  return tuple(entry for value in values for entry in parser.parse(value))


# Files already imported by `import_extensions`, by absolute path, and the
# sha256 of the source each was imported from.
_IMPORTED_FILES: Dict[str, object] = {}
_IMPORTED_SOURCES: Dict[str, str] = {}


def entries(extensions: Optional[Iterable[str]]) -> Tuple[str, ...]:
  """`config.extensions` as a tuple of entries, a file's leading `~` made the
  home folder; ConfigError for a string or a bad entry."""
  if isinstance(extensions, str):
    raise ConfigError(
        f'config.extensions={extensions!r} is a string; give a tuple of files or module names: '
        f'config.extensions = ({extensions!r},) in Python, '
        f'--config.extensions="({extensions!r},)" on the command line.'
    )
  given = tuple(extensions or ())
  for entry in given:
    if not isinstance(entry, str) or not entry:
      raise ConfigError(
          f'config.extensions holds {entry!r}: give Python files (path/to/file.py) or module names.'
      )
  return tuple(os.path.expanduser(entry) if is_file(entry) else entry for entry in given)


def is_file(entry: str) -> bool:
  """Whether a config.extensions entry names a file (else a module)."""
  return entry.endswith('.py')


def import_extensions(extensions: Optional[Iterable[str]]) -> None:
  """Imports each entry of `config.extensions`: a local Python file (a path
  ending in .py, relative to the working directory, `~` the home folder) or an
  importable module name. Each import runs the file's `register` calls. A file
  is imported once per process, and not again when a normal `import` has
  imported it already.

  Raises:
    ConfigError: a string instead of a tuple, a file that does not exist, a
      module that cannot be found, or an error raised while importing one,
      naming the entry.
  """
  for entry in entries(extensions):
    if is_file(entry):
      _import_file(entry)
    else:
      _import_module(entry)


def _imported_module_of(path: str) -> Optional[object]:
  """A module already imported from the file at `path`, if any."""
  real = os.path.realpath(path)
  for module in list(sys.modules.values()):
    file = getattr(module, '__file__', None)
    if file and os.path.realpath(file) == real:
      return module
  return None


def _import_file(entry: str) -> None:
  path = os.path.abspath(entry)
  if path in _IMPORTED_FILES:
    return
  if storage.scheme_of(entry):
    raise ConfigError(
        f'config.extensions names {entry!r}: an extension is imported from a local file; copy '
        'it to this machine and name that copy.'
    )
  if not os.path.isfile(path):
    raise ConfigError(f'config.extensions names {entry!r}, which is not a file; fix the path.')
  source = _sha256(_read_bytes(path))
  imported = _imported_module_of(path)
  if imported is not None:
    _IMPORTED_FILES[path], _IMPORTED_SOURCES[path] = imported, source
    return
  name = 'linformer_jax_extension_' + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except Exception as error:  # pylint: disable=broad-exception-caught
    del sys.modules[name]
    raise ConfigError(
        f'config.extensions: importing {entry!r} failed: {type(error).__name__}: {error}'
    ) from error
  _IMPORTED_FILES[path], _IMPORTED_SOURCES[path] = module, source


def _import_module(entry: str) -> None:
  try:
    importlib.import_module(entry)
  except ModuleNotFoundError as error:
    if error.name and entry.startswith(error.name):
      raise ConfigError(
          f'config.extensions names the module {entry!r}, which cannot be found; give a '
          'path ending in .py or a module on the Python path.'
      ) from None
    raise ConfigError(
        f'config.extensions: importing {entry!r} failed: {type(error).__name__}: {error}'
    ) from error
  except ConfigError:
    raise
  except Exception as error:  # pylint: disable=broad-exception-caught
    raise ConfigError(
        f'config.extensions: importing {entry!r} failed: {type(error).__name__}: {error}'
    ) from error


def _read_bytes(path: str) -> bytes:
  with storage.open_file(path, 'rb') as reader:
    return reader.read()


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def saved_entries(extensions: Optional[Iterable[str]]) -> Tuple[str, ...]:
  """`extensions` as a run's config.json keeps them: each file by its absolute
  path (a relative one is taken from the working directory, as importing it
  does), so that the run loads from any directory; module names as they are."""
  return tuple(os.path.abspath(e) if is_file(e) else e for e in entries(extensions))


def _copy_names(given: Sequence[str]) -> Dict[str, str]:
  """Each file of the entries `given` -> the name of its copy in
  WORKDIR/extensions: its own name, or NAME_2.py, NAME_3.py, ... for a later
  file of a name taken."""
  names: Dict[str, str] = {}
  for entry in given:
    if not is_file(entry) or entry in names:
      continue
    stem = os.path.splitext(os.path.basename(entry))[0]
    name, number = f'{stem}.py', 1
    while name in names.values():
      number += 1
      name = f'{stem}_{number}.py'
    names[entry] = name
  return names


def keep_copies(extensions: Optional[Iterable[str]], workdir: str) -> None:
  """Copies each file of `extensions` into WORKDIR/extensions/, so that the
  run still loads when the original moves or changes (`import_run_extensions`)."""
  copies = _copy_names(saved_entries(extensions))
  if not copies:
    return
  folder = run_folder.RunFolder(workdir).extensions
  storage.makedirs(folder)
  for entry, name in copies.items():
    storage.copy_file(entry, storage.join(folder, name))


def _importable_copy(copy: str, data: bytes) -> str:
  """A local file holding the copy: the copy itself (its absolute path), or for
  a gs:// run a file under the temporary folder named by its content."""
  if not storage.is_object_store(copy):
    return os.path.abspath(copy)
  folder = os.path.join(tempfile.gettempdir(), 'linformer_jax_extensions', _sha256(data)[:16])
  local = os.path.join(folder, os.path.basename(copy))
  if not os.path.isfile(local):
    os.makedirs(folder, exist_ok=True)
    storage.write_text(local, data.decode())
  return local


def import_run_extensions(
    extensions: Optional[Iterable[str]], workdir: str
) -> Tuple[Tuple[str, ...], str]:
  """Imports the extensions of the run in `workdir` (its config.json's).

  A file the run keeps a copy of (WORKDIR/extensions/) is imported from its
  original when that is still there and identical to the copy, else from the
  copy. A module name, or a file of a run saved before runs kept copies, is
  imported as `import_extensions` does.

  Returns:
    The entries imported, in order (a copy's path where the copy was used),
    for the run's `config.extensions`; and one line saying which file was
    used for each copy kept ('' when the run keeps none).

  Raises:
    ConfigError: as `import_extensions`, or a file that changed after this
      process imported it from the original, while the run needs its copy.
  """
  given = entries(extensions)
  copies = _copy_names(given)
  copies_folder = run_folder.RunFolder(workdir).extensions
  used, notes = [], []
  for entry in given:
    copy = storage.join(copies_folder, copies[entry]) if entry in copies else None
    if copy is None or not storage.isfile(copy):
      used.append(entry)
      continue
    kept = _read_bytes(copy)
    original = _read_bytes(entry) if os.path.isfile(entry) else None
    if original == kept:
      used.append(entry)
      notes.append(f"{entry} (the original, identical to the run's copy)")
      continue
    how = 'moved' if original is None else 'changed since the run was trained'
    local = _importable_copy(copy, kept)
    imported = _IMPORTED_SOURCES.get(os.path.abspath(entry))
    if imported is not None and imported != _sha256(kept):
      raise ConfigError(
          f'{entry} {how}, and this process imported it before as it is now; load {workdir} '
          f"in a new Python process to use the run's copy {copy}."
      )
    if imported is not None:  # the run's code, imported before the original moved
      _IMPORTED_FILES.setdefault(os.path.abspath(local), _IMPORTED_FILES[os.path.abspath(entry)])
    used.append(local)
    notes.append(f"{entry} {how}: the run's copy {copy}")
  import_extensions(used)
  for entry, local in zip(given, used):
    if local != entry and not os.path.isfile(entry):
      # The copy stands for the moved file: a config naming it imports nothing more.
      _IMPORTED_FILES.setdefault(os.path.abspath(entry), _IMPORTED_FILES[os.path.abspath(local)])
  line = f'Extensions of {workdir}: ' + '; '.join(notes) + '.' if notes else ''
  return tuple(used), line
