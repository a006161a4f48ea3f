"""config.extensions: the files and modules of a user's own parts, imported.

Importing a file runs its `register` calls, so that its parts (projections,
attention kinds, pretraining sources, tasks: `registry`) become names a config
may use. Every command imports `config.extensions` before the config is
checked; `import_command_extensions` imports those a command line names before
the --config.X overrides are typed, and adds the settings their parts declare
(`registry.add_declared_settings`), so that --config.model.NAME=VALUE parses
for a setting of an extension. A file is imported once per process, and not
again when a normal `import` has imported it already.
"""

import importlib
import importlib.util
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from absl import flags
from ml_collections.config_flags import tuple_parser

from linformer_jax import registry
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
  repeated ones, or None when it has none."""
  values = flag_arguments(argv, 'config.extensions')
  if not values:
    return None
  parser = tuple_parser.TupleParser()
  return tuple(entry for value in values for entry in parser.parse(value))


# Files already imported by `import_extensions`, by absolute path.
_IMPORTED_FILES: Dict[str, object] = {}


def import_extensions(extensions: Optional[Iterable[str]]) -> None:
  """Imports each entry of `config.extensions`: a Python file (a path ending in
  .py, relative to the working directory) or an importable module name. Each
  import runs the file's `register` calls. A file is imported once per process,
  and not again when a normal `import` has imported it already.

  Raises:
    ConfigError: a string instead of a tuple, a file that does not exist, a
      module that cannot be found, or an error raised while importing one,
      naming the entry.
  """
  if isinstance(extensions, str):
    raise ConfigError(
        f'config.extensions={extensions!r} is a string; pass a tuple of files or module '
        f'names, e.g. --config.extensions="({extensions!r},)".'
    )
  for entry in extensions or ():
    if not isinstance(entry, str) or not entry:
      raise ConfigError(
          f'config.extensions holds {entry!r}: give Python files (path/to/file.py) or module names.'
      )
    if entry.endswith('.py'):
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
  if not os.path.isfile(path):
    raise ConfigError(f'config.extensions names {entry!r}, which is not a file; fix the path.')
  imported = _imported_module_of(path)
  if imported is not None:
    _IMPORTED_FILES[path] = imported
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
  _IMPORTED_FILES[path] = module


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
