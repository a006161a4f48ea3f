"""Checks of the training fields of a config, before anything is built.

The model's own fields are checked by `ModelConfig`; this module checks the
rest and compares a workdir's saved run with the requested one.
"""

import dataclasses
from typing import Any, Mapping

import ml_collections

from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig

_POSITIVE_INTS = ('total_steps', 'batch_size', 'eval_batch_size', 'grad_accum_steps',
                  'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints')
_NON_NEGATIVE_FLOATS = ('learning_rate', 'end_learning_rate', 'weight_decay',
                        'grad_clip_norm')
_MODEL_DEFAULTS = {field.name: field.default for field in dataclasses.fields(ModelConfig)}
# Data fields that change the token ids, and so the meaning of the parameters.
_DATA_FIELDS_FIXED_BY_A_RUN = ('tokenizer', 'vocab_size')


TASKS = ('masked_lm', 'classification')


def validate(config: ml_collections.ConfigDict) -> ModelConfig:
  """Raises ConfigError for a bad training field; returns the model config."""
  if config.get('task', 'masked_lm') not in TASKS:
    raise ConfigError(f'config.task={config.task!r} is not allowed: use one of {TASKS}.')
  for field in _POSITIVE_INTS:
    value = config[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use a positive integer.')
  for field in _NON_NEGATIVE_FLOATS:
    if config[field] < 0:
      raise ConfigError(f'config.{field}={config[field]!r} is not allowed: use a value >= 0.')
  if config.learning_rate == 0:
    raise ConfigError('config.learning_rate=0 is not allowed: use a positive value.')
  if not 0 <= config.warmup_steps <= config.total_steps:
    raise ConfigError(
        f'config.warmup_steps={config.warmup_steps} is not allowed: use a value in '
        f'[0, total_steps={config.total_steps}].')
  if config.batch_size % config.grad_accum_steps:
    raise ConfigError(
        f'config.batch_size={config.batch_size} is not allowed: it must be divisible '
        f'by grad_accum_steps={config.grad_accum_steps}.')
  for field, value in (('adam_b1', config.adam_b1), ('adam_b2', config.adam_b2)):
    if not 0 <= value < 1:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use a value in [0, 1).')
  if not 0 < config.data.mask_rate < 1:
    raise ConfigError(
        f'config.data.mask_rate={config.data.mask_rate!r} is not allowed: use a '
        'value in (0, 1).')
  return ModelConfig.from_config(config.model)


def check_same_model(saved: Mapping[str, Any], config: ml_collections.ConfigDict,
                     workdir: str) -> None:
  """Refuses to resume a workdir whose run used another model or tokenizer."""
  requested = {'model': config.model.to_dict(),
               'data': {k: config.data[k] for k in _DATA_FIELDS_FIXED_BY_A_RUN}}
  stored = {'model': dict(saved.get('model', {})),
            'data': {k: saved.get('data', {}).get(k)
                     for k in _DATA_FIELDS_FIXED_BY_A_RUN}}
  for section in ('model', 'data'):
    for key in sorted(set(requested[section]) | set(stored[section])):
      old, new = stored[section].get(key), requested[section].get(key)
      if section == 'model' and key not in stored[section]:
        old = _MODEL_DEFAULTS.get(key)  # a run saved before the field existed
      if isinstance(old, list):
        old = tuple(old)
      if isinstance(new, list):
        new = tuple(new)
      if old != new:
        raise ConfigError(
            f'{workdir} holds a run with config.{section}.{key}={old!r}, not {new!r}; '
            'use another --workdir, or the same value to resume it.')
