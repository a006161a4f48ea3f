"""A flag-parsing error in one line that says what to change.

absl and ml_collections word a bad command line for the programmer: an
unknown --config.PATH override is a KeyError whose text is the key's repr, an
unknown flag keeps its suggestions in its message, a flag file that cannot be
opened hides the path in its cause. `flag_error_words` turns each into the
line `cli` prints before it exits with the usage-error code.
"""

import re
from typing import Sequence

from absl import flags


def _config_override(argv: Sequence[str], field: str) -> str:
  """The --config.PATH[=VALUE] argument whose PATH names `field`, else --config.FIELD."""
  for argument in argv:
    path = argument.split('=', 1)[0]
    if path.startswith('--config.') and field in path[len('--config.') :].split('.'):
      return argument
  return f'--config.{field}'


def _unknown_field_words(error: Exception, argv: Sequence[str]) -> str:
  """An unknown --config.PATH override in words. ml_collections raises a
  KeyError (inside an AttributeError) whose text is the key's repr, a newline
  and maybe its suggestion, or names the lookup that failed."""
  inner = error.args[0] if error.args and isinstance(error.args[0], KeyError) else error
  text = str(inner.args[0]) if inner.args else str(inner)
  lookup = re.search(r'Attempting to lookup: (\S+)', text)
  if lookup:
    *parents, field = lookup.group(1).split('.')
    return f'{_config_override(argv, field)}: config.{".".join(parents)} has no field {field!r}'
  field = text.splitlines()[0].strip('\'"')
  argument = _config_override(argv, field)
  path = argument.split('=', 1)[0][len('--') :].split('.')
  group = '.'.join(path[: path.index(field)]) if field in path else 'config'
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  hint = f'; did you mean {group}.{suggestion.group(1)}?' if suggestion else ''
  return f'{argument}: {group} has no field {field!r}{hint}'


def flag_error_words(error: Exception, argv: Sequence[str]) -> str:
  """A flag-parsing error in one line that says what to change."""
  if isinstance(error, flags.CantOpenFlagFileError):
    cause = error.__context__
    if isinstance(cause, OSError):
      return f'--flagfile={cause.filename} cannot be opened ({cause.strerror}).'
  if isinstance(error, flags.UnrecognizedFlagError):
    # absl keeps the suggestions only in its message: "... Did you mean: a, b ?"
    suggested = re.search(r'Did you mean: (.*) \?$', str(error))
    names = suggested.group(1).split(', ') if suggested else []
    hint = f'; did you mean {" or ".join(f"--{name}" for name in names)}?' if names else ''
    return f'--{error.flagname} is not a flag of this command{hint} (see --helpfull)'
  if isinstance(error, (KeyError, AttributeError)):
    return f'{_unknown_field_words(error, argv)} (--helpconfig lists every field)'
  return f'{error} (see --helpfull)'
