"""A run's settings, checked and typed once at the entry, and compared with a
saved run's.

`settings_of(config)` checks the training fields (the model's own are checked
by `ModelConfig`) and returns them typed: `RunSettings`. `complete(config)` is
the one compatibility shim: it gives a config saved before a field existed
that field, at the value the run had then, so no code reads a field with a
default of its own. `expand_paths(config)` makes `~` the home folder in every
field that names a file or folder, and lists them for `storage.check_paths`.
"""

import dataclasses
import math
import os
from typing import Any, Iterable, List, Mapping, Optional, Tuple

import ml_collections

from linformer_jax import extensions as extensions_lib
from linformer_jax import registry
from linformer_jax.data import cache
from linformer_jax.errors import ConfigError
from linformer_jax.model import model_config
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import sharding

# What a run had before each of these fields existed (configs/default.py gives
# a new run its values): `complete` adds them to an older config.json.
FIELDS_ADDED_SINCE = {
    'task': 'masked_lm',
    'extensions': (),
    'platform': '',
    'init_from': '',
    'compilation_cache_dir': '',
    'profile_steps': (),
    'restore_step': 0,
    'max_skipped_steps': 0,  # stop at the first bad step
    'spike_factor': 0.0,  # only NaN or inf is a bad step
    'projection_learning_rate_scale': 1.0,
    'projection_remove_common_update': False,
    'fsdp': False,
    'axis_rules': sharding.DEFAULT_AXIS_RULES,
}
DATA_FIELDS_ADDED_SINCE = {
    'source': 'embedded',
    'split_files': {},
    'cache_dir': '',
    'prepared_dir': '',
    'prepare_workers': 0,
    'sequences_per_shard': 8192,
    'tfds_name': '',
    'tfds_text_key': 'text',
    'tfds_data_dir': '',
    'tfds_download': False,
}

# The fields that name a file or folder ('' = none), below config.
PATH_FIELDS = (
    'init_from',
    'compilation_cache_dir',
    'data.path',
    'data.cache_dir',
    'data.prepared_dir',
    'data.tfds_data_dir',
)
# The settings of a path that can only be a local folder, and what to give
# instead of a gs:// URL (`storage.check_paths`).
LOCAL_PATHS = {
    'config.data.cache_dir': cache.LOCAL_ONLY,
    f'${cache.CACHE_DIR_VARIABLE}': cache.LOCAL_ONLY,
}

_POSITIVE_INTS = (
    'total_steps',
    'batch_size',
    'eval_batch_size',
    'grad_accum_steps',
    'log_every',
    'eval_every',
    'checkpoint_every',
    'keep_checkpoints',
)
_NON_NEGATIVE_FLOATS = ('learning_rate', 'end_learning_rate', 'weight_decay', 'grad_clip_norm')
MODEL_DEFAULTS = {
    field.name: field.default
    for field in dataclasses.fields(ModelConfig)
    if field.name not in model_config.NOT_CONFIG_FIELDS
}
# Model fields that change how a pass is computed, not what it computes: a run
# may be resumed or evaluated with other values.
EXECUTION_FIELDS = ('query_blocks_per_step', 'inference_chunk', 'attention_kernel', 'remat')
# Model fields that only say how a fresh run's arrays start: a checkpoint holds
# its own values, so a run resumes or is scored whatever they say now.
INITIALISATION_FIELDS = ('projection_init', 'projection_init_noise')
# Data fields that change the token ids, and so the meaning of the parameters.
DATA_FIELDS_FIXED_BY_A_RUN = ('tokenizer', 'vocab_size')


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """AdamW, its learning-rate schedule and the rules for a learned E/F."""

  learning_rate: float
  warmup_steps: int
  total_steps: int
  end_learning_rate: float
  weight_decay: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  grad_clip_norm: float
  projection_learning_rate_scale: float
  projection_remove_common_update: bool
  projection: str  # config.model.projection: only 'linear' E/F have updates centred
  # (name, learning_rate_scale, weight_decay) of each parameter the attention
  # kind declares (`attention_kinds.Parameter`).
  attention_parameters: Tuple[Tuple[str, float, Optional[bool]], ...] = ()


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The training loop's length, periodic actions, checkpoints and seed."""

  total_steps: int
  batch_size: int
  log_every: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  seed: int
  profile_steps: Optional[Tuple[int, int]]  # (FIRST, LAST) traced; None for no trace


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """A run's checked settings: the model, the optimizer and the loop."""

  model: ModelConfig
  optimizer: OptimizerSettings
  loop: LoopSettings


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds to `config`, in place, each field of FIELDS_ADDED_SINCE,
  DATA_FIELDS_ADDED_SINCE and `ModelConfig` it lacks, at the value a run had
  before the field existed; returns it. Every entry calls it: a config file, a saved
  config.json, the Python API."""
  with config.unlocked():
    for field, value in FIELDS_ADDED_SINCE.items():
      if field not in config:
        config[field] = value
    if 'data' in config:
      for field, value in DATA_FIELDS_ADDED_SINCE.items():
        if field not in config.data:
          config.data[field] = value
    if 'model' in config:
      if 'attention_dropout_rate' not in config.model:
        # Before the three rates, dropout_rate also dropped out the MLP's
        # hidden, and nothing dropped out attention weights.
        config.model.attention_dropout_rate = 0.0
        if 'activation_dropout_rate' not in config.model:
          model = config.model
          rate = model.dropout_rate if 'dropout_rate' in model else MODEL_DEFAULTS['dropout_rate']
          model.activation_dropout_rate = rate
      for field, value in MODEL_DEFAULTS.items():
        if field not in config.model and value is not dataclasses.MISSING:
          config.model[field] = value
  return config


def expand_paths(config: ml_collections.ConfigDict) -> List[Tuple[str, str]]:
  """Makes a leading `~` the home folder, in place, in each of PATH_FIELDS and
  each file of config.extensions: the shell expands it at the start of a word,
  not after `=` (--config.data.path=~/books), and a run keeps the path it used.

  Returns:
    (setting, path) of each path the config names, for `storage.check_paths`:
    ('config.FIELD', path) of the fields set, ('config.extensions', file) of
    each file, and the cache folder $LINFORMER_JAX_CACHE_DIR names when
    config.data.cache_dir does not.
  """
  paths = []
  for name in PATH_FIELDS:
    *parents, field = name.split('.')
    section = config
    for parent in parents:  # a config of some other tool may lack a section or field
      section = section[parent] if parent in section else {}
    if isinstance(section.get(field), str):
      section[field] = os.path.expanduser(section[field])
      paths.append((f'config.{name}', section[field]))
  if 'extensions' in config:
    config.extensions = extensions_lib.entries(config.extensions)
    paths += [('config.extensions', e) for e in config.extensions if extensions_lib.is_file(e)]
  variable = os.environ.get(cache.CACHE_DIR_VARIABLE, '')
  if variable and not dict(paths).get('config.data.cache_dir'):
    paths.append((f'${cache.CACHE_DIR_VARIABLE}', variable))
  return paths


def settings_of(config: ml_collections.ConfigDict) -> RunSettings:
  """The run's settings, typed.

  Raises:
    ConfigError: a bad field, naming it and the values allowed.
  """
  complete(config)
  for field in _POSITIVE_INTS:
    value = config[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use a positive integer.')
  profile_steps = tuple(config.profile_steps or ())
  if profile_steps and (
      len(profile_steps) != 2
      or not all(isinstance(s, int) and not isinstance(s, bool) for s in profile_steps)
      or not 1 <= profile_steps[0] <= profile_steps[1]
  ):
    raise ConfigError(
        f'config.profile_steps={profile_steps!r} must be two steps (FIRST, LAST) with '
        "1 <= FIRST <= LAST, e.g. --config.profile_steps='(10, 12)', or () for no trace."
    )
  for field in _NON_NEGATIVE_FLOATS + ('adam_eps',):
    value = config[field]
    # NaN passes every comparison, so finiteness is checked first.
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use a finite value >= 0.')
  if not isinstance(config.seed, int) or isinstance(config.seed, bool):
    raise ConfigError(f'config.seed={config.seed!r} is not allowed: use an integer.')
  for field in ('max_skipped_steps', 'restore_step'):
    value = config[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use an integer >= 0.')
  scale = config.projection_learning_rate_scale
  if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 <= scale < math.inf:
    raise ConfigError(
        f'config.projection_learning_rate_scale={scale!r} is not allowed: use a finite '
        'number >= 0 (1 = the learning rate of every other weight, 0 = frozen).'
    )
  for field in ('fsdp', 'projection_remove_common_update'):
    if not isinstance(config[field], bool):
      raise ConfigError(f'config.{field}={config[field]!r} is not allowed: use True or False.')
  factor = config.spike_factor
  if isinstance(factor, bool) or not math.isfinite(factor) or not (factor == 0 or factor > 1):
    raise ConfigError(
        f'config.spike_factor={factor!r} is not allowed: use a number > 1, or 0 for no spike rule.'
    )
  if config.learning_rate == 0:
    raise ConfigError('config.learning_rate=0 is not allowed: use a positive value.')
  if not 0 <= config.warmup_steps <= config.total_steps:
    raise ConfigError(
        f'config.warmup_steps={config.warmup_steps} is not allowed: use a value in '
        f'[0, total_steps={config.total_steps}].'
    )
  if config.batch_size % config.grad_accum_steps:
    raise ConfigError(
        f'config.batch_size={config.batch_size} is not allowed: it must be divisible '
        f'by grad_accum_steps={config.grad_accum_steps}.'
    )
  for field, value in (('adam_b1', config.adam_b1), ('adam_b2', config.adam_b2)):
    if not 0 <= value < 1:
      raise ConfigError(f'config.{field}={value!r} is not allowed: use a value in [0, 1).')
  if not 0 < config.data.mask_rate < 1:
    raise ConfigError(
        f'config.data.mask_rate={config.data.mask_rate!r} is not allowed: use a value in (0, 1).'
    )
  model = ModelConfig.from_config(config.model)
  return RunSettings(
      model=model,
      optimizer=OptimizerSettings(
          **{
              field.name: config[field.name]
              for field in dataclasses.fields(OptimizerSettings)
              if field.name not in ('projection', 'attention_parameters')
          },
          projection=config.model.projection,
          attention_parameters=tuple(
              (name, parameter.learning_rate_scale, parameter.weight_decay)
              for name, parameter in model.attention_kind.parameters(model).items()
          ),
      ),
      loop=LoopSettings(
          **{
              field.name: config[field.name]
              for field in dataclasses.fields(LoopSettings)
              if field.name != 'profile_steps'
          },
          profile_steps=profile_steps or None,
      ),
  )


def _comparable(value: Any) -> Any:
  """JSON gives lists where the config holds tuples; compare them as tuples."""
  return tuple(value) if isinstance(value, list) else value


def first_difference(
    saved: Mapping[str, Any],
    requested: Mapping[str, Any],
    fields: Iterable[str],
    defaults: Optional[Mapping[str, Any]] = None,
) -> Optional[Tuple[str, Any, Any]]:
  """The first of `fields` whose saved value differs from the requested one,
  as (field, saved value, requested value); None when all agree. A field
  either side lacks counts at its value in `defaults`."""
  defaults = defaults or {}
  for field in fields:
    old = _comparable(saved.get(field, defaults.get(field)))
    new = _comparable(requested.get(field, defaults.get(field)))
    if old != new:
      return field, old, new
  return None


def check_same_model(
    saved: Mapping[str, Any], config: ml_collections.ConfigDict, workdir: str
) -> None:
  """Refuses to resume a workdir whose run used another model or tokenizer."""
  saved_model = dict(saved.get('model', {}))
  requested_model = config.model.to_dict()
  # A run saved before a kind declaring a setting was imported used its default.
  declared = registry.declared_settings(model_config.SETTINGS_SECTION)
  model_defaults = {**MODEL_DEFAULTS, **{n: d.setting.default for n, d in declared.items()}}
  for section, old, new, fields, defaults in (
      (
          'model',
          saved_model,
          requested_model,
          # A saved field no kind imported now declares belongs to a kind this
          # run does not use: a run of that kind differs in the kind's name.
          sorted(
              (set(requested_model) | set(model_defaults))
              - set(EXECUTION_FIELDS)
              - set(INITIALISATION_FIELDS)
          ),
          model_defaults,
      ),
      (
          'data',
          dict(saved.get('data', {})),
          config.data.to_dict(),
          DATA_FIELDS_FIXED_BY_A_RUN,
          None,
      ),
  ):
    difference = first_difference(old, new, fields, defaults)
    if difference:
      field, old_value, new_value = difference
      raise ConfigError(
          f'{workdir} holds a run with config.{section}.{field}={old_value!r}, not '
          f'{new_value!r}; use another --workdir, or --config.{section}.{field}='
          f'{old_value!r} to resume or evaluate it.'
      )
