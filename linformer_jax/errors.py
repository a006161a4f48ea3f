"""The one error type for bad user input.

`ConfigError` (a `ValueError`) means the user must change something: a config
field, a flag, a data path or the workdir. Its message names the field or path,
the value, and what is allowed. The command-line entry points report it as one
line with exit code 2; library callers can catch it as a ValueError.
"""


class ConfigError(ValueError):
  """A bad config value, flag, data path or workdir."""
