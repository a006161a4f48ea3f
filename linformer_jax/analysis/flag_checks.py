"""Checks of benchmark settings that end in a ConfigError naming the flag.

Every benchmark command validates its settings the same way: one line that
names the flag, the value given and what to use instead.
"""

from typing import Any, Iterable

from linformer_jax.errors import ConfigError


def require(ok: bool, flag: str, value: Any, advice: str) -> None:
  """Raises `--FLAG=VALUE is not allowed: ADVICE.` unless ok."""
  if not ok:
    shown = ','.join(map(str, value)) if isinstance(value, (tuple, list)) else value
    raise ConfigError(f'--{flag}={shown} is not allowed: {advice}.')


def require_lengths(flag: str, values: Iterable[int]) -> None:
  """One or more positive integers, e.g. sequence lengths."""
  values = tuple(values)
  ok = bool(values) and min(values) >= 1
  require(ok, flag, values, 'give one or more positive integers')


def require_model_dims(settings: Any, names: Iterable[str]) -> None:
  """Positive integer fields `names` of settings, and heads that divide the width."""
  for name in names:
    value = getattr(settings, name)
    require(value >= 1, name, value, 'use a positive integer')
  advice = f'it must be divisible by --num_heads={settings.num_heads}'
  require(settings.hidden_dim % settings.num_heads == 0, 'hidden_dim', settings.hidden_dim, advice)
