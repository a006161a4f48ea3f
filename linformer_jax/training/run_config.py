"""A run's settings, checked and typed once at the entry, and compared with a
saved run's.

`RunConfig.from_config(config)` checks the config and returns it typed, one
tree: `RunConfig{model, data, optimizer, loop, mesh}` and the run's own
fields; `RunConfig.to_dict()` gives it back as the config held it, for
config.json, checkpoints and comparisons with a saved run's. Each field is
declared once, in its section's dataclass, with `settings_flags.setting`: its
type, help, bounds and, for a field added since the first runs, `before`, the
value a run saved earlier had (`ModelConfig`'s fields: their defaults).
`complete(config)` gives an old config.json those values, so no code reads a
field with a default of its own.
`expand_paths(config)` makes `~` the home folder in every field that names a
file or folder, and lists them for `storage.check_paths`.
"""

import copy
import dataclasses
import math
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import ml_collections

from linformer_jax import extensions as extensions_lib
from linformer_jax import registry
from linformer_jax import settings_flags
from linformer_jax.data import cache
from linformer_jax.data import data_config
from linformer_jax.data.data_config import DataConfig
from linformer_jax.errors import ConfigError
from linformer_jax.model import model_config
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting
from linformer_jax.training import sharding

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


def _finite_at_least(minimum: float) -> Callable[[float], bool]:
  return lambda value: math.isfinite(value) and value >= minimum


def _profile_window(steps: Tuple[int, ...]) -> bool:
  return not steps or (
      len(steps) == 2
      and all(isinstance(step, int) and not isinstance(step, bool) for step in steps)
      and 1 <= steps[0] <= steps[1]
  )


def _axis_rules(rules: Tuple[Any, ...]) -> bool:
  return all(isinstance(rule, (tuple, list)) and len(rule) == 2 for rule in rules)


_FINITE_AT_LEAST_ZERO = dict(check=_finite_at_least(0), allowed='use a finite value >= 0')
_INTEGER = dict(allowed='use an integer')


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """AdamW, its learning-rate schedule and the rules for a learned E/F."""

  learning_rate: float = setting(
      help_text='peak learning rate after warm-up',
      check=lambda rate: 0 < rate < math.inf,
      allowed='use a finite value > 0',
  )
  warmup_steps: int = setting(help_text='linear warm-up from 0 to learning_rate', minimum=0)
  end_learning_rate: float = setting(
      help_text='learning rate reached by linear decay at total_steps', **_FINITE_AT_LEAST_ZERO
  )
  weight_decay: float = setting(
      help_text='AdamW decoupled weight decay (not on biases or norms)', **_FINITE_AT_LEAST_ZERO
  )
  adam_b1: float = setting(
      help_text='AdamW beta1', check=lambda b: 0 <= b < 1, allowed='use a value in [0, 1)'
  )
  adam_b2: float = setting(
      help_text='AdamW beta2', check=lambda b: 0 <= b < 1, allowed='use a value in [0, 1)'
  )
  adam_eps: float = setting(help_text='AdamW epsilon', **_FINITE_AT_LEAST_ZERO)
  grad_clip_norm: float = setting(
      help_text='clip gradients to this global norm (0 disables)', **_FINITE_AT_LEAST_ZERO
  )
  projection_learning_rate_scale: float = setting(
      help_text="the learned E/F's learning rate and weight decay, times the rest's",
      check=_finite_at_least(0),
      allowed='use a finite number >= 0 (1 = the learning rate of every other weight, 0 = frozen)',
      before=1.0,
  )
  projection_remove_common_update: bool = setting(
      help_text='remove from each update of a learned E/F its mean over the k slots',
      before=False,
  )
  # Not config fields: the schedule's length (config.total_steps, the loop's)
  # and what the model says.
  total_steps: int = 0
  projection: str = ''  # config.model.projection: only 'linear' E/F have updates centred
  # (name, learning_rate_scale, weight_decay) of each parameter the attention
  # kind declares (`attention_kinds.Parameter`).
  attention_parameters: Tuple[Tuple[str, float, Optional[bool]], ...] = ()


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The training loop's length, periodic actions, checkpoints and seed."""

  total_steps: int = setting(help_text='optimizer steps to train for', minimum=1)
  batch_size: int = setting(help_text='global batch, in sequences', minimum=1)
  eval_batch_size: int = setting(help_text='batch size for evaluation', minimum=1)
  grad_accum_steps: int = setting(help_text='micro-batches per step', minimum=1)
  log_every: int = setting(help_text='steps between progress lines', minimum=1)
  eval_every: int = setting(help_text='steps between evaluations', minimum=1)
  checkpoint_every: int = setting(help_text='steps between checkpoints', minimum=1)
  keep_checkpoints: int = setting(help_text='newest checkpoints kept', minimum=1)
  seed: int = setting(help_text='seeds initialisation, shuffling, masking, dropout', **_INTEGER)
  max_skipped_steps: int = setting(
      help_text='non-finite steps in a row skipped before the run stops', minimum=0, before=0
  )
  spike_factor: float = setting(
      help_text='a loss above this times the recent mean is a spike (0 = only NaN or inf)',
      check=lambda factor: math.isfinite(factor) and (factor == 0 or factor > 1),
      allowed='use a number > 1, or 0 for no spike rule',
      before=0.0,  # only NaN or inf is a bad step
  )
  restore_step: int = setting(
      help_text='resume from this kept step (0 = the newest)', minimum=0, before=0
  )
  profile_steps: Tuple[int, ...] = setting(
      help_text='(FIRST, LAST): a jax.profiler trace of those steps; () = none',
      check=_profile_window,
      allowed='give two steps (FIRST, LAST) with 1 <= FIRST <= LAST, e.g. '
      "--config.profile_steps='(10, 12)', or () for no trace",
      before=(),
  )

  @property
  def profile_window(self) -> Optional[Tuple[int, int]]:
    """(FIRST, LAST) steps traced; None for no trace."""
    return tuple(self.profile_steps) if self.profile_steps else None


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """The device mesh and how parameters and batches are split over it."""

  mesh_shape: Tuple[int, ...] = setting(
      help_text="devices along ('data', 'model'); -1 = all remaining"
  )
  axis_rules: Tuple[Tuple[str, Any], ...] = setting(
      help_text='logical parameter axes -> mesh axes (None = replicated)',
      check=_axis_rules,
      allowed="give (logical axis, mesh axis) pairs, e.g. (('batch', 'data'),)",
      before=sharding.DEFAULT_AXIS_RULES,
  )
  fsdp: bool = setting(
      help_text="split parameters and optimizer state over 'data' too (ZeRO-3)", before=False
  )


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's settings, checked and typed once: `RunConfig.from_config(config)`.

  Attributes:
    task: the registered task (config.task).
    extensions: files or modules imported first (config.extensions).
    platform: the backend the run expects ('' = whichever JAX finds).
    init_from: another run's workdir to take parameters from ('' = none).
    compilation_cache_dir: JAX's persistent compilation cache ('' = JAX's own).
    model: config.model, checked (`ModelConfig`).
    data: config.data (`DataConfig`, or the task's own, e.g. a
      `ClassificationDataConfig`).
    optimizer: the optimizer's top-level fields.
    loop: the loop's top-level fields.
    mesh: the mesh's top-level fields.
    model_as_configured: (field, value) of each config.model field whose
      value `model` holds otherwise, sorted: one it resolved (projection_init
      '' as the projection's own; attention_kernel 'auto' as a kernel,
      `with_model`) or leaves out (a kind's setting at its default, which
      commands list, `registry.add_declared_settings`). `to_dict` gives
      these values back.
  """

  task: str = setting(help_text='the task', before='masked_lm')
  extensions: Tuple[str, ...] = setting(help_text='files or modules imported first', before=())
  platform: str = setting(help_text="the backend expected: 'cpu', 'gpu', 'tpu' or ''", before='')
  init_from: str = setting(help_text="another run's workdir to start from", before='')
  compilation_cache_dir: str = setting(help_text="JAX's persistent compilation cache", before='')
  model: Optional[ModelConfig] = None
  data: Optional[DataConfig] = None
  optimizer: Optional[OptimizerSettings] = None
  loop: Optional[LoopSettings] = None
  mesh: Optional[MeshSettings] = None
  model_as_configured: Tuple[Tuple[str, Any], ...] = ()

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'RunConfig':
    """The run's settings, typed, after `complete(config)`.

    Raises:
      ConfigError: a bad field, naming it and the values allowed.
    """
    complete(config)
    loop = settings_flags.from_config(LoopSettings, config)
    data = DataConfig.of(config.data, config.task)
    model = ModelConfig.from_config(config.model)
    optimizer = settings_flags.from_config(
        OptimizerSettings,
        config,
        total_steps=loop.total_steps,
        projection=model.projection,
        attention_parameters=tuple(
            (name, parameter.learning_rate_scale, parameter.weight_decay)
            for name, parameter in model.attention_kind.parameters(model).items()
        ),
    )
    if optimizer.warmup_steps > loop.total_steps:
      raise ConfigError(
          f'config.warmup_steps={optimizer.warmup_steps} is not allowed: use a value in '
          f'[0, total_steps={loop.total_steps}].'
      )
    if loop.batch_size % loop.grad_accum_steps:
      raise ConfigError(
          f'config.batch_size={loop.batch_size} is not allowed: it must be divisible '
          f'by grad_accum_steps={loop.grad_accum_steps}.'
      )
    return settings_flags.from_config(
        cls,
        config,
        model=model,
        data=data,
        optimizer=optimizer,
        loop=loop,
        mesh=settings_flags.from_config(MeshSettings, config),
        model_as_configured=_held_otherwise(
            {name: config.model[name] for name in config.model}, model, ()
        ),
    )

  def with_model(self, model: ModelConfig) -> 'RunConfig':
    """These settings with `model` in their model's place, e.g. its attention
    kernel resolved for a mesh (`ModelConfig.with_kernel_for`); `to_dict`
    still gives each field's value as the config set it."""
    held = _held_otherwise(self.model.to_dict(), model, self.model_as_configured)
    return dataclasses.replace(self, model=model, model_as_configured=held)

  def to_dict(self) -> Dict[str, Any]:
    """The settings as the config they were typed from held them, after
    `complete`: every declared field of each section, the settings of
    registered parts that config.model and config.data list, and each
    model field as the config set it (`model_as_configured`). Through JSON
    it equals that config's `to_dict()` (a sequence is a tuple here, as in
    a config file); a field no section declares, which `from_config` passes
    over, is not in it. What a run saves (config.json, its checkpoints) and
    compares with the config a run saved.
    """
    top_level = {
        name: getattr(section, name)
        for section in (self, self.loop, self.optimizer, self.mesh)
        for name in settings_flags.config_fields(type(section))
    }
    model = {**self.model.to_dict(), **dict(self.model_as_configured)}
    # A copy: what the caller changes (config.json's extensions) leaves the settings as they are.
    return copy.deepcopy({**top_level, 'model': model, 'data': self.data.to_dict()})


def _held_otherwise(
    configured: Mapping[str, Any], model: ModelConfig, known: Tuple[Tuple[str, Any], ...]
) -> Tuple[Tuple[str, Any], ...]:
  """`known`, sorted, with (field, value) added for each field of `configured`
  (config.model's fields and values) that `model` holds otherwise or leaves
  out, unless `known` names it already."""
  held = dict(known)
  typed = model.to_dict()
  for name, value in configured.items():
    if name not in held and (name not in typed or _comparable(typed[name]) != _comparable(value)):
      held[name] = value
  return tuple(sorted(held.items()))


# The dataclasses declaring the top level's fields.
TOP_LEVEL_SECTIONS = (RunConfig, LoopSettings, OptimizerSettings, MeshSettings)


def fields_added_since(task: str) -> Dict[str, Dict[str, Any]]:
  """section ('' = the top level, 'data') -> {field: its `before`} of each
  field of a `task` run's config added since the first runs."""
  data_type = data_config.SECTION_OF_TASK.get(task, DataConfig)
  return {
      '': {
          name: value
          for settings_type in TOP_LEVEL_SECTIONS
          for name, value in settings_flags.fields_added_since(settings_type).items()
      },
      'data': settings_flags.fields_added_since(data_type),
  }


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds to `config`, in place, each declared field it lacks, at the value a
  run had before the field existed (its declaration's `before`; a
  `ModelConfig` field's default); returns it. Every entry calls it: a config
  file, a saved config.json, the Python API."""
  with config.unlocked():
    top_level = fields_added_since('')['']
    for field, value in top_level.items():
      if field not in config:
        config[field] = value
    if 'data' in config:
      for field, value in fields_added_since(config.task)['data'].items():
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


def described(config: ml_collections.ConfigDict) -> List[str]:
  """Every field of a run's config, with its value, help and bounds, one line
  each (`--helpconfig`): the top level's, config.model's and config.data's
  declared fields, then the settings the registered parts declare.

  Args:
    config: the command's config, its extensions imported.
  """
  complete(config)
  lines = []
  for section in TOP_LEVEL_SECTIONS:
    lines += settings_flags.described_section(section, config, 'config')
  lines += settings_flags.described_section(ModelConfig, config.model, 'config.model')
  data_type = data_config.SECTION_OF_TASK.get(config.task, DataConfig)
  lines += settings_flags.described_section(data_type, config.data, 'config.data')
  for section, values in (('config.model', config.model), ('config.data', config.data)):
    for name, declared in sorted(registry.declared_settings(section).items()):
      value = values.get(name, declared.setting.default)
      owners = ', '.join(f'{field.rsplit(".", 1)[1]}={owner!r}' for field, owner in declared.owners)
      lines.append(
          settings_flags.described(
              section, name, value, declared.setting.declaration, declared.setting.type
          )
          + f'; a setting of {owners}'
      )
  return lines


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


def check_same_model(saved: Mapping[str, Any], settings: RunConfig, workdir: str) -> None:
  """Refuses to resume a workdir whose run used another model or tokenizer:
  the config it saved against the settings asked for now."""
  requested = settings.to_dict()
  saved_model = dict(saved.get('model', {}))
  requested_model = requested['model']
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
          requested['data'],
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
