"""Named extension points: a config string chooses a part, a file registers one.

A `Registry` maps the names a config field accepts (`config.model.projection`,
`config.model.attention`, `config.data.source`, `config.task`) to the objects
that implement them. The package registers its own parts where they are
defined; a researcher's part, in a file of their own, registers the same way:

  from linformer_jax.model import projections

  @projections.REGISTRY.register('strided')
  class Strided(projections.SequenceProjectionKind):
    ...

and becomes usable from a config, a sweep and every command once that file is
imported. Naming it in `config.extensions` (a tuple of Python files or module
names) has every command import it before the config is checked (`extensions`),
and keeps it in the workdir's config.json. A file imported both ways (a normal
`import` and config.extensions) registers its parts once.

A model kind (attention or projection) may declare settings of its own, each a
`Setting` (name, type, default, check), in its `settings` attribute: they are
fields of `config.model` like the built-in ones, checked by `ModelConfig`,
settable as --config.model.NAME=VALUE once `extensions.import_command_extensions`
has added them to a command's config, and written to the run's config.json.
`docs/extending.md` walks through one example of each kind.
"""

import dataclasses
import os
import sys
from typing import Any, Callable, Dict, Generic, List, NamedTuple, Optional, Tuple, TypeVar

from linformer_jax import settings_flags
from linformer_jax.errors import ConfigError

T = TypeVar('T')

# The types a declared setting may have: those a --config.X=VALUE flag parses.
SETTING_TYPES = (bool, int, float, str, tuple)


@dataclasses.dataclass(frozen=True)
class Setting:
  """A config field a registered part declares for itself.

  Its bounds and help are a `settings_flags.Declaration`, as a built-in
  field's are (`settings_flags.setting`): the same words (`check`, `allowed`,
  `choices`, `minimum`, `help_text`), checked and worded by the same rules.

  Attributes:
    name: the field's name in its registry's config section, e.g.
      'temperature_init' for config.model.temperature_init.
    type: one of SETTING_TYPES; an int is taken where a float is declared.
    default: the value a config that does not set the field has.
    check: value -> whether it is allowed (its type is checked first); None
      allows every value of the type.
    allowed: what the one-line error says to use, e.g. 'use a number > 0';
      left out, it follows from the bounds (`Declaration.advice`).
    help_text: what the setting does.
    choices: the values allowed, if they can be listed.
    minimum: the smallest value of an int setting.
  """

  name: str
  type: type
  default: Any
  check: Optional[Callable[[Any], bool]] = None
  allowed: str = ''
  help_text: str = ''
  choices: Optional[Tuple[Any, ...]] = None
  minimum: Optional[int] = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f'Setting name {self.name!r} must be a Python identifier.')
    if self.type not in SETTING_TYPES:
      raise ValueError(
          f'Setting {self.name!r}: type {self.type!r} is not one of {SETTING_TYPES}; a command '
          'line cannot set it.'
      )
    if not self.allowed:
      object.__setattr__(self, 'allowed', self.declaration.advice(self.type))
    if not self.allows(self.default):
      raise ValueError(f'Setting {self.name!r}: the default {self.default!r} fails its own check.')

  @property
  def declaration(self) -> settings_flags.Declaration:
    """Its help and bounds, as a built-in field declares them."""
    return settings_flags.Declaration(
        help_text=self.help_text,
        choices=self.choices,
        minimum=self.minimum,
        check=self.check,
        allowed=self.allowed,
    )

  def normalised(self, value: Any) -> Any:
    """The value in the declared type: a float for an int, a tuple for a list."""
    if self.type is float and isinstance(value, int) and not isinstance(value, bool):
      return float(value)
    if self.type is tuple and isinstance(value, list):
      return tuple(value)
    return value

  def allows(self, value: Any) -> bool:
    """Whether `value` (normalised) has the declared type and bounds."""
    return self.declaration.allows(self.normalised(value), self.type)

  def same_declaration(self, other: 'Setting') -> bool:
    """Whether two declarations agree (a subclass inherits its parent's `settings`;
    a file imported twice declares equal settings with new check functions)."""
    return (self.name, self.type, self.default, self.allowed, self.choices, self.minimum) == (
        other.name,
        other.type,
        other.default,
        other.allowed,
        other.choices,
        other.minimum,
    )


class DeclaredSetting(NamedTuple):
  """A setting and the registered parts declaring it.

  Attributes:
    setting: the declaration.
    owners: (registry field, registered name) pairs, e.g.
      (('config.model.attention', 'tempered_linformer'),).
  """

  setting: Setting
  owners: Tuple[Tuple[str, str], ...]


class Registry(Generic[T]):
  """The parts one config field can name, by name.

  Attributes:
    field: the config field whose values are the names, e.g.
      'config.model.projection'; it words the errors.
    section: the config section the field is in ('config.model'), where the
      settings its parts declare live.
    declares_settings: its parts' `settings` attribute declares fields of
      `section` (the model kinds'); other registries never read it.
  """

  def __init__(self, field: str, *, declares_settings: bool = False):
    self.field = field
    self.section = field.rsplit('.', 1)[0]
    self.declares_settings = declares_settings
    self._parts: Dict[str, T] = {}
    _REGISTRIES.append(self)

  def register(self, name: str) -> Callable[[T], T]:
    """A decorator registering what it decorates under `name`.

    Registering a second, different part under a name already taken is an
    error (two files would silently fight over one config value). The same
    part again (a module imported twice, or one file imported both by a normal
    `import` and through config.extensions: the same file and class name)
    replaces it harmlessly. A declared setting that another part declares
    differently is an error too.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f'{self.field}: a registered name must be a non-empty string, not {name!r}.')

    def add(part: T) -> T:
      held = self._parts.get(name)
      if held is not None and held is not part and _identity(held) != _identity(part):
        raise ValueError(
            f'{self.field}={name!r} is registered already (by {_qualified_name(held)}); '
            'choose another name.'
        )
      if self.declares_settings:
        _check_new_settings(self, name, part)
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

  def settings_of(self, name: str) -> Tuple[Setting, ...]:
    """The settings the part registered under `name` declares."""
    if not self.declares_settings:
      return ()
    return tuple(getattr(self._parts[name], 'settings', ()) or ())

  def __contains__(self, name: object) -> bool:
    return isinstance(name, str) and name in self._parts


# Every registry, so that the settings of one config section can be collected.
_REGISTRIES: List[Registry] = []


def _check_new_settings(registry: Registry, name: str, part: Any) -> None:
  """Raises a ValueError for bad `settings` of a part about to be registered."""
  settings = getattr(part, 'settings', ()) or ()
  if not isinstance(settings, (tuple, list)) or not all(isinstance(s, Setting) for s in settings):
    raise ValueError(
        f'{registry.field}={name!r}: `settings` must be a tuple of registry.Setting, '
        f'not {settings!r}.'
    )
  for setting in settings:
    declared = declared_settings(registry.section).get(setting.name)
    others = [
        owner for owner in (declared.owners if declared else ()) if owner != (registry.field, name)
    ]
    if others and not declared.setting.same_declaration(setting):
      field, owner = others[0]
      raise ValueError(
          f'{registry.section}.{setting.name} is declared already, differently, by '
          f'{field}={owner!r}; give the setting another name.'
      )


def declared_settings(section: str) -> Dict[str, DeclaredSetting]:
  """The settings the registered parts declare in a config section, by name.

  Args:
    section: e.g. 'config.model'.
  """
  found: Dict[str, DeclaredSetting] = {}
  for registry in _REGISTRIES:
    if registry.section != section:
      continue
    for name in registry.names():
      for setting in registry.settings_of(name):
        held = found.get(setting.name)
        owners = (held.owners if held else ()) + ((registry.field, name),)
        found[setting.name] = DeclaredSetting(held.setting if held else setting, owners)
  return found


def declared_value(section: str, name: str, values: Any, part: str) -> Any:
  """SECTION.NAME, a setting a registered `part` ('kind', 'source') declares:
  its value in `values` (name -> value pairs, or a mapping), else its default,
  in its declared type.

  Raises:
    ConfigError: no registered part declares `name`.
  """
  declared = declared_settings(section)
  if name not in declared:
    raise ConfigError(
        f'{section}.{name} is a setting no registered {part} declares; add '
        f"registry.Setting({name!r}, ...) to the {part}'s `settings`."
    )
  declaration = declared[name].setting
  return declaration.normalised(dict(values).get(name, declaration.default))


def add_declared_settings(config: Any) -> None:
  """Adds each declared setting that `config` (the whole run config, an
  ml_collections.ConfigDict, locked or not) lacks, with its default.

  What a command does before its --config.X overrides are parsed, and what a
  notebook does before training, so that the run's config.json lists every
  setting of the kinds it may use.
  """
  sections = {registry.section for registry in _REGISTRIES if registry.declares_settings}
  for section in sorted(sections):
    target = config
    for part in section.split('.')[1:]:
      target = target[part]
    missing = {n: d for n, d in declared_settings(section).items() if n not in target}
    if missing:
      with target.unlocked():
        for name, declared in missing.items():
          target[name] = declared.setting.default


def _identity(part: object) -> Tuple[str, str]:
  """The source file (or module name) and qualified name a part was defined by."""
  module = getattr(part, '__module__', type(part).__module__)
  path = getattr(sys.modules.get(module), '__file__', None)
  name = getattr(part, '__qualname__', type(part).__qualname__)
  return (os.path.realpath(path) if path else module), name


def _qualified_name(part: object) -> str:
  module = getattr(part, '__module__', type(part).__module__)
  name = getattr(part, '__qualname__', type(part).__qualname__)
  return f'{module}.{name}'
