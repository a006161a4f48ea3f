"""Settings declared once: dataclass fields that carry their flag, help and bounds.

Every setting is declared this way: a command's own flags, and the run
config's fields (`training/run_config.RunConfig`, whose `--config.X` flags
ml_collections defines from the config file). A settings dataclass names
each setting once, as a field made
with `setting(default, help_text)`. That field is the library's setting (its
name, type and default) and the command's absl flag at the same time:

  @dataclasses.dataclass(frozen=True)
  class Settings:
    seq_lens: Sequence[int] = setting((512, 1024), 'Sequence lengths n.')
    dtype: str = setting('float32', 'Compute dtype.', choices=DTYPES)

  define_flags(Settings)           # in the command module: --seq_lens, --dtype
  settings = from_flags(Settings)  # in its main: the parsed values, validated

The flag's kind follows the field's type: int, float, bool, str (an enum with
`choices`), and a sequence of ints or strings as a comma-separated list, or
with `repeated=True` a flag given once per string (`--set=a=1 --set=b=2`). A
field's bounds are part of its declaration (`choices`, `minimum`): the
dataclass's `__post_init__` calls `check(self)`, which makes every sequence a
tuple and refuses a value out of bounds, then adds its own checks with
`require`. Each raises a ConfigError naming the flag, which the command prints
as one line. A flag may differ from its field
in name and unit (`--memory_limit_gb` fills `memory_limit_bytes`), told by
`flag`, `flag_default` and `from_flag`. Fields made without `setting` are no
flags; the command passes them to `from_flags` itself.

A run config's section is a settings dataclass too, read from its
ml_collections section by `from_config` instead of from flags. Its fields
declare their bounds the same way, plus `check` and `allowed` for bounds a
minimum cannot say (`allowed` is what the one-line error tells to use), and
`before`: the value a run saved before the field existed had, which
`fields_added_since` gives an old config.json (`run_config.complete`).
"""

import collections.abc
import dataclasses
import functools
import math
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import flags

from linformer_jax.errors import ConfigError

# The flags defined here belong to the command that calls `define_flags`, so
# that its --help lists them.
flags.disclaim_key_flags()

# The key of a field's metadata that makes it a flag.
_FLAG = 'flag'
# `flag_default` left out: the flag's default is the field's.
_FIELD_DEFAULT = object()
# `before` left out: every run's config has had the field.
ALWAYS = object()


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a setting declares beside its name, type and default: its help, its
  bounds and how its flag reads it (the arguments of `setting`, which
  documents each). A `registry.Setting` of a model kind or a data source holds
  one too, so every setting is checked and worded by the same rules."""

  help_text: str = ''
  name: Optional[str] = None
  default: Any = _FIELD_DEFAULT
  from_flag: Optional[Callable[[Any], Any]] = None
  choices: Optional[Sequence[Any]] = None
  required: bool = False
  repeated: bool = False
  minimum: Optional[int] = None
  check: Optional[Callable[[Any], bool]] = None
  allowed: str = ''
  before: Any = ALWAYS

  def advice(self, value_type: Any) -> str:
    """What the one-line error about a refused value tells to use."""
    if self.allowed:
      return self.allowed
    if self.choices is not None:
      return f'use one of {", ".join(map(repr, self.choices))}'
    if self.minimum == 1:
      return 'use a positive integer'
    if self.minimum is not None:
      return f'use an integer >= {self.minimum}'
    if value_type is bool:
      return 'use True or False'
    if value_type is float:
      return 'use a finite number'
    return f'use a value of type {getattr(value_type, "__name__", value_type)}'

  def allows(self, value: Any, value_type: Any) -> bool:
    """Whether a config value (a list as a tuple) has `value_type`, is finite
    where a float has no `check` of its own, and is within the bounds."""
    if not _has_type(value, value_type):
      return False
    if isinstance(value, float) and not math.isfinite(value) and self.check is None:
      return False
    return value is None or not (
        (self.choices is not None and value not in self.choices)
        or (self.minimum is not None and value < self.minimum)
        or (self.check is not None and not self.check(value))
    )


def setting(
    default: Any = dataclasses.MISSING,
    help_text: str = '',
    *,
    default_factory: Any = dataclasses.MISSING,
    flag: Optional[str] = None,
    flag_default: Any = _FIELD_DEFAULT,
    from_flag: Optional[Callable[[Any], Any]] = None,
    choices: Optional[Sequence[str]] = None,
    required: bool = False,
    repeated: bool = False,
    minimum: Optional[int] = None,
    check: Optional[Callable[[Any], bool]] = None,
    allowed: str = '',
    before: Any = ALWAYS,
) -> Any:
  """A dataclass field that is also a command-line flag.

  Args:
    default: the setting's default, in the library and on the command line.
      Left out (and no default_factory): the flag is required.
    help_text: the flag's help.
    default_factory: as in `dataclasses.field`; the flag then defaults to
      None, which leaves the field to the factory.
    flag: the flag's name when it is not the field's.
    flag_default: the flag's default when it is not the field's, e.g. None for
      a value worked out at run time by `from_flag`.
    from_flag: turns the parsed flag value into the field's value (called
      with None too); without it a None flag leaves the field's default.
    choices: the allowed strings of a str setting (an enum flag), or of each
      string of a sequence, which must then hold one or more.
    required: the flag must be given even though the field has a default.
    repeated: a sequence of strings given as one flag per string.
    minimum: the smallest value of an int setting, or of each value of a
      sequence of ints, which must then hold one or more.
    check: value -> whether it is allowed, after its type (a config field's).
    allowed: what the one-line error tells to use when `check` refuses,
      e.g. 'use a value in [0, 1)'.
    before: the value of a run saved before the field existed (a config
      field added since the first runs); left out, every run has it.
  """
  spec = Declaration(
      help_text,
      flag,
      flag_default,
      from_flag,
      choices,
      required,
      repeated,
      minimum,
      check,
      allowed,
      before,
  )
  return dataclasses.field(default=default, default_factory=default_factory, metadata={_FLAG: spec})


@functools.cache
def _flag_fields(settings_type: type) -> Tuple[Tuple[dataclasses.Field, Declaration, Any], ...]:
  """(field, its declaration, its type with Optional removed) of every
  `setting` field of a settings dataclass."""
  hints = typing.get_type_hints(settings_type)
  found = []
  for field in dataclasses.fields(settings_type):
    spec = field.metadata.get(_FLAG)
    if spec is None:
      continue
    field_type = hints[field.name]
    if typing.get_origin(field_type) is typing.Union:
      arguments = [arg for arg in typing.get_args(field_type) if arg is not type(None)]
      if len(arguments) == 1:  # Optional[X]; a union of several types stays one
        field_type = arguments[0]
    found.append((field, spec, field_type))
  return tuple(found)


def _item_type(field_type: Any) -> Optional[type]:
  """The item type of a sequence type (Sequence[int] -> int), None for a scalar."""
  origin = typing.get_origin(field_type)
  if isinstance(origin, type) and issubclass(origin, collections.abc.Sequence):
    if origin is not str:
      return typing.get_args(field_type)[0]
  return None


def flag_name(field: dataclasses.Field) -> str:
  """The command-line name of a field made with `setting`."""
  return field.metadata[_FLAG].name or field.name


def define_flags(settings_type: type, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines an absl flag for every `setting` field of `settings_type`."""
  for field, spec, field_type in _flag_fields(settings_type):
    name = flag_name(field)
    if spec.default is not _FIELD_DEFAULT:
      default = spec.default
    elif field.default is not dataclasses.MISSING:
      default = field.default
    else:
      default = None
    common = dict(name=name, default=default, help=spec.help_text, flag_values=flag_values)
    if spec.repeated:
      if default is not None:
        common['default'] = list(default)
      flags.DEFINE_multi_string(**common)
    elif _item_type(field_type) is not None:
      if default is not None:
        common['default'] = [str(item) for item in default]
      flags.DEFINE_list(**common)
    elif spec.choices is not None:
      flags.DEFINE_enum(enum_values=list(spec.choices), **common)
    elif field_type is bool:
      flags.DEFINE_boolean(**common)
    elif field_type is int:
      flags.DEFINE_integer(**common)
    elif field_type is float:
      flags.DEFINE_float(**common)
    elif field_type is str:
      flags.DEFINE_string(**common)
    else:
      raise TypeError(f'{settings_type.__name__}.{field.name}: no flag for type {field_type}.')
    no_default = field.default is dataclasses.MISSING
    if spec.required or (no_default and field.default_factory is dataclasses.MISSING):
      flags.mark_flag_as_required(name, flag_values=flag_values)


def int_list(flag: str, values: Sequence[str]) -> list:
  """The values of a comma-separated list flag as ints; ConfigError naming the flag."""
  try:
    return [int(value) for value in values]
  except ValueError:
    raise ConfigError(
        f'--{flag}={",".join(values)} is not allowed: give comma-separated integers.'
    ) from None


def require(ok: bool, flag: str, value: Any, advice: str) -> None:
  """Raises `--FLAG=VALUE is not allowed: ADVICE.` unless ok."""
  if not ok:
    shown = ','.join(map(str, value)) if isinstance(value, (tuple, list)) else value
    raise ConfigError(f'--{flag}={shown} is not allowed: {advice}.')


def check(settings: Any) -> None:
  """Makes each sequence field of the frozen dataclass `settings` a tuple, and checks
  every value against the `choices` and `minimum` its `setting` declares."""
  for field, spec, field_type in _flag_fields(type(settings)):
    value, name = getattr(settings, field.name), flag_name(field)
    if value is None:  # an Optional setting left unset
      continue
    if spec.repeated or _item_type(field_type) is not None:
      value = tuple(value)
      object.__setattr__(settings, field.name, value)
    if spec.choices is not None and isinstance(value, tuple):
      ok = bool(value) and set(value) <= set(spec.choices)
      require(ok, name, value, f'give one or more of {", ".join(spec.choices)}')
    elif spec.choices is not None:
      require(value in spec.choices, name, value, f'use one of {", ".join(spec.choices)}')
    if spec.minimum is None:
      continue
    positive = spec.minimum == 1
    if isinstance(value, tuple):
      ok = bool(value) and min(value) >= spec.minimum
      items = 'positive integers' if positive else f'integers >= {spec.minimum}'
      require(ok, name, value, f'give one or more {items}')
    else:
      advice = 'use a positive integer' if positive else f'use an integer >= {spec.minimum}'
      require(value >= spec.minimum, name, value, advice)


def from_flags(
    settings_type: type, flag_values: flags.FlagValues = flags.FLAGS, **given: Any
) -> Any:
  """The settings of the parsed flags, with the fields in `given` (no flags) added.

  Raises:
    ConfigError: a value the settings do not allow, naming its flag.
  """
  values: Dict[str, Any] = {}
  for field, spec, field_type in _flag_fields(settings_type):
    name = flag_name(field)
    value = flag_values[name].value
    if spec.repeated and value is not None:
      value = tuple(value)
    elif value is not None and _item_type(field_type) is int:
      value = int_list(name, value)
    if spec.from_flag is not None:
      value = spec.from_flag(value)
    elif value is None:
      continue
    values[field.name] = value
  return settings_type(**values, **given)


def _has_type(value: Any, field_type: Any) -> bool:
  """Whether a config value has a field's type: an int is a float, a bool is no
  int, a list is a tuple (JSON's), and None is an Optional field's."""
  if typing.get_origin(field_type) is typing.Union:
    return any(_has_type(value, arg) for arg in typing.get_args(field_type))
  if field_type is type(None):
    return value is None
  if field_type is Any:
    return True
  if isinstance(value, bool):
    return field_type is bool
  if field_type is float:
    return isinstance(value, (int, float))
  origin = typing.get_origin(field_type) or field_type
  if origin in (tuple, collections.abc.Sequence):
    return isinstance(value, (tuple, list))
  if origin in (dict, collections.abc.Mapping):
    return isinstance(value, collections.abc.Mapping)
  return isinstance(value, origin)


def config_fields(settings_type: type) -> Dict[str, dataclasses.Field]:
  """name -> field of each `setting` field of a run config section."""
  return {field.name: field for field, _, _ in _flag_fields(settings_type)}


def fields_added_since(settings_type: type) -> Dict[str, Any]:
  """name -> `before` of each field a run saved long ago may lack."""
  return {
      field.name: spec.before
      for field, spec, _ in _flag_fields(settings_type)
      if spec.before is not ALWAYS
  }


def config_value_error(section: str, name: str, value: Any, advice: str) -> ConfigError:
  """`config.SECTION.NAME=VALUE is not allowed: ADVICE.`"""
  return ConfigError(f'{section}.{name}={value!r} is not allowed: {advice}.')


# A field a section lacks that every run has had.
_MISSING = object()


def _section_value(values: Mapping[str, Any], name: str, spec: Declaration) -> Any:
  """A field's value in a config section, plain (a dict for a ConfigDict, a
  tuple for a list); its `before` where the section lacks it; else _MISSING."""
  if name in values:
    value = values[name]
  elif spec.before is not ALWAYS:
    value = spec.before
  else:
    return _MISSING
  if hasattr(value, 'to_dict'):  # a section of an ml_collections.ConfigDict
    value = value.to_dict()
  return tuple(value) if isinstance(value, list) else value


def from_config(
    settings_type: type, values: Mapping[str, Any], section: str = 'config', **given: Any
) -> Any:
  """The settings of a run config's section, checked against their declarations.

  Args:
    settings_type: a frozen dataclass of `setting` fields.
    values: the section (an ml_collections.ConfigDict or a dict); a field it
      lacks takes its `before`, and it may hold other fields (another
      section's, at the config's top level).
    section: how the error names the section, e.g. 'config.data'.
    **given: the fields that are no config fields.

  Raises:
    ConfigError: a value of the wrong type, out of its declared bounds, or a
      field missing that every run has, naming it as `section.NAME`.
  """
  found: Dict[str, Any] = {}
  for field, spec, field_type in _flag_fields(settings_type):
    value = _section_value(values, field.name, spec)
    if value is _MISSING:
      raise ConfigError(
          f'{section} has no field {field.name!r}; add it (configs/default.py has every field '
          'a run needs, with its comment).'
      )
    if not spec.allows(value, field_type):
      raise config_value_error(section, field.name, value, spec.advice(field_type))
    found[field.name] = value
  return settings_type(**found, **given)


def check_fields(settings: Any, section: str) -> None:
  """Checks each `setting` field of a built settings dataclass against its
  declaration, as `from_config` checks a section, making a list a tuple: for a
  dataclass built directly as well as from a config (`ModelConfig`).

  Raises:
    ConfigError: `SECTION.NAME=VALUE is not allowed: ...`, the first field refused.
  """
  for field, spec, field_type in _flag_fields(type(settings)):
    value = getattr(settings, field.name)
    if isinstance(value, list):
      value = tuple(value)
      object.__setattr__(settings, field.name, value)
    if not spec.allows(value, field_type):
      raise config_value_error(section, field.name, value, spec.advice(field_type))


def described(section: str, name: str, value: Any, spec: Declaration, value_type: Any) -> str:
  """One field as `--helpconfig` lists it: `SECTION.NAME = VALUE  # HELP (BOUNDS)`,
  the bounds in the words of its one-line error, where it declares any."""
  bounded = spec.allowed or spec.check or spec.choices is not None or spec.minimum is not None
  words = [spec.help_text] if spec.help_text else []
  if bounded or not words:
    words.append(f'({spec.advice(value_type)})')
  return f'{section}.{name} = {value!r}  # {" ".join(words)}'


def described_section(settings_type: type, values: Mapping[str, Any], section: str) -> List[str]:
  """Every `setting` field of a settings dataclass, with its value in `values`
  (a config section; a field it lacks shows its `before`), as `described`."""
  lines = []
  for field, spec, field_type in _flag_fields(settings_type):
    value = _section_value(values, field.name, spec)
    if value is _MISSING:
      continue
    lines.append(described(section, field.name, value, spec, field_type))
  return lines
