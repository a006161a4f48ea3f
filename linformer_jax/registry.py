"""Named extension points: a config string chooses a part, a file registers one.

A `Registry` maps the names a config field accepts (`config.model.projection`,
`config.model.attention`, `config.data.source`) to the objects that implement
them. The package registers its own parts where they are defined; a
researcher's part, in a file of their own, registers the same way:

  from linformer_jax.model import projections

  @projections.REGISTRY.register('strided')
  class Strided(projections.SequenceProjectionKind):
    ...

and becomes usable from a config, a sweep and every command once that file is
imported. Naming it in `config.extensions` (a list of Python files or module
names) has every command import it before the config is checked, and keeps it
in the workdir's config.json, so evaluation and analyses of the run import it
too. `docs/extending.md` walks through one example of each kind.
"""

import importlib
import importlib.util
import os
import sys
from typing import Callable, Dict, Generic, Iterable, Optional, Tuple, TypeVar

from linformer_jax.errors import ConfigError

T = TypeVar('T')


class Registry(Generic[T]):
  """The parts one config field can name, by name.

  Attributes:
    field: the config field whose values are the names, e.g.
      'config.model.projection'; it words the errors.
  """

  def __init__(self, field: str):
    self.field = field
    self._parts: Dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """A decorator registering what it decorates under `name`.

    Registering a second, different part under a name already taken is an
    error (two files would silently fight over one config value); registering
    the same object again (a module imported twice) is harmless.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f'{self.field}: a registered name must be a non-empty string, not {name!r}.')

    def add(part: T) -> T:
      held = self._parts.get(name)
      if held is not None and held is not part and _qualified_name(held) != _qualified_name(part):
        raise ValueError(
            f'{self.field}={name!r} is registered already (by {_qualified_name(held)}); '
            'choose another name.'
        )
      self._parts[name] = part
      return part

    return add

  def get(self, name: str) -> T:
    """The part registered under `name`; ConfigError listing the names otherwise."""
    try:
      return self._parts[name]
    except (KeyError, TypeError):
      raise ConfigError(
          f'{self.field}={name!r} is not allowed: use one of {self.names()} '
          '(a part of your own registers itself in a file named in config.extensions).'
      ) from None

  def names(self) -> Tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._parts)

  def __contains__(self, name: object) -> bool:
    return isinstance(name, str) and name in self._parts


def _qualified_name(part: object) -> str:
  module = getattr(part, '__module__', type(part).__module__)
  name = getattr(part, '__qualname__', type(part).__qualname__)
  return f'{module}.{name}'


# Files already imported by `import_extensions`, by absolute path.
_IMPORTED_FILES: Dict[str, object] = {}


def import_extensions(extensions: Optional[Iterable[str]]) -> None:
  """Imports each entry of `config.extensions`: a Python file (a path ending in
  .py, relative to the working directory) or an importable module name. Each
  import runs the file's `register` calls. A file is imported once per process.

  Raises:
    ConfigError: a file that does not exist, a module that cannot be found, or
      an error raised while importing one, naming the entry.
  """
  for entry in extensions or ():
    if not isinstance(entry, str) or not entry:
      raise ConfigError(
          f'config.extensions holds {entry!r}: give Python files (path/to/file.py) or module names.'
      )
    if entry.endswith('.py'):
      _import_file(entry)
    else:
      _import_module(entry)


def _import_file(entry: str) -> None:
  path = os.path.abspath(entry)
  if path in _IMPORTED_FILES:
    return
  if not os.path.isfile(path):
    raise ConfigError(f'config.extensions names {entry!r}, which is not a file; fix the path.')
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
