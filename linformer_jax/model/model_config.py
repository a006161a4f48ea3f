"""The model's hyper-parameters, validated once, from `config.model`.

`ModelConfig.from_config(config.model)` turns the `ml_collections.ConfigDict`
into a frozen dataclass (hashable, so Flax modules can hold it) and raises a
`ConfigError` (a ValueError) naming the field, its value and what is allowed for anything the
model could not honour. Nothing is silently truncated or rounded. The attention
kinds and sequence projections allowed are those registered
(`attention_kinds.REGISTRY`, `projections.REGISTRY`), a researcher's own
included once its file is imported.

The settings those kinds declare (`registry.Setting`) are fields of
config.model too: `from_config` takes them, `extension_settings` keeps those
that differ from their defaults, and a kind reads one with `setting(name)`.
"""

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import jax.numpy as jnp

from linformer_jax import registry
from linformer_jax import settings_flags
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import projections
from linformer_jax.model.attention import AUTO_KERNEL
from linformer_jax.model.attention import FUSED_KERNELS
from linformer_jax.model.attention import KERNEL_CHOICES
from linformer_jax.model.attention import MeshPartition
from linformer_jax.model.attention import PartitionedKernel
from linformer_jax.model.attention import kernel_for_platform
from linformer_jax.settings_flags import setting

SHARING_MODES = ('none', 'headwise', 'kv', 'layerwise')
# How a classifier summarises the sequence: the first token's vector, or the
# mean over the real (non-padding) tokens.
POOLING_TYPES = ('first', 'mean', 'attention')
# What each encoder layer keeps for the backward pass (`model.remat`): 'none'
# keeps every activation; the others recompute the layer from its input, keeping
# nothing else ('full'), the outputs of its matrix products ('dots'), or those
# without batch axes, that is the dense layers' but not attention's ('dots_no_batch');
# see layers.REMAT_POLICIES.
REMAT_POLICIES = ('none', 'full', 'dots', 'dots_no_batch')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# The config section whose fields the model kinds' declared settings are.
SETTINGS_SECTION = 'config.model'


def _one_of(choices: Tuple[str, ...]) -> Dict[str, Any]:
  """The bounds of a field that takes one of `choices`, as its error words them."""
  return dict(choices=choices, allowed=f'use one of {choices}')


# Bounds shared by several fields.
_RATE = dict(check=lambda rate: 0.0 <= rate < 1.0, allowed='use a value in [0, 1)')
_COUNT = dict(minimum=0, allowed='use a non-negative integer')
# ModelConfig's fields that are not fields of config.model: the kinds' own
# settings (each its own config.model field) and what a run derives.
NOT_CONFIG_FIELDS = ('extension_settings', 'kernel_partition')


def _field_error(field: str, value: Any, allowed: str) -> ConfigError:
  return ConfigError(f'config.model.{field}={value!r} is not allowed: {allowed}.')


def _owners_in_words(owners: Tuple[Tuple[str, str], ...]) -> str:
  """(('config.model.attention', 'x'),) as "attention='x'"."""
  return ' or '.join(f'{field[len(SETTINGS_SECTION) + 1 :]}={name!r}' for field, name in owners)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the encoder; see configs/ for a comment per field."""

  vocab_size: int = setting(help_text="token ids; equals the tokenizer's", minimum=1)
  max_len: int = setting(help_text='n, the sequence length the model is built for', minimum=1)
  num_layers: int = setting(12, 'encoder layers', minimum=1)
  num_heads: int = setting(12, 'attention heads per layer', minimum=1)
  hidden_dim: int = setting(768, 'model width', minimum=1)
  mlp_dim: int = setting(3072, 'MLP hidden units', minimum=1)
  attention: str = setting('linformer', 'the registered attention kind')
  projected_len: Union[int, Tuple[int, ...]] = setting(
      128, 'k, the projected length: one int, or one per layer'
  )
  sharing: str = setting(
      'layerwise',
      "E/F sharing: 'none', 'headwise', 'kv' or 'layerwise'",
      **_one_of(SHARING_MODES),
  )
  projection: str = setting('linear', 'the registered sequence projection of keys and values')
  projection_init: str = setting(
      'jl', "how a learned E/F starts ('' = the projection's own default)"
  )
  projection_init_noise: float = setting(
      0.0,
      "stddev of Gaussian noise on projection_init='local' (0 = none)",
      check=lambda noise: 0 <= noise < math.inf,
      allowed='use a finite stddev >= 0',
  )
  dropout_rate: float = setting(0.1, 'dropout on embeddings and each residual branch', **_RATE)
  attention_dropout_rate: float = setting(0.1, 'dropout on the attention weights', **_RATE)
  activation_dropout_rate: float = setting(0.0, "dropout on the MLP's GELU output", **_RATE)
  pre_layer_norm: bool = setting(False, "pre-LN instead of RoBERTa's post-LN")
  dtype: str = setting('float32', 'compute dtype', **_one_of(tuple(DTYPES)))
  num_segments: int = setting(
      0,
      'segment embeddings (0 = none)',
      minimum=0,
      allowed='use 0 (no segment embedding, as RoBERTa) or the number of segments, e.g. 2 '
      'for sentence pairs',
  )
  layer_norm_epsilon: float = setting(
      1e-5,
      'added to the variance in layer norms',
      check=lambda epsilon: 0 < epsilon < 1,
      allowed='use a value in (0, 1): 1e-5 (RoBERTa), 1e-12 (BERT)',
  )
  pooling: str = setting(
      'first',
      "classifier input: the 'first' token, the 'mean' or a learned 'attention'",
      **_one_of(POOLING_TYPES),
  )
  causal: bool = setting(
      False, 'left-to-right attention', allowed='use True (left to right) or False'
  )
  block_len: int = setting(64, 'causal Linformer: b, tokens per block', **_COUNT)
  query_blocks_per_step: int = setting(
      0, 'causal Linformer: query blocks at once (0 = all)', **_COUNT
  )
  inference_chunk: int = setting(
      0, 'inference: queries and MLP in chunks of this size (0 = all)', **_COUNT
  )
  attention_kernel: str = setting(
      'auto',
      "what computes softmax attention ('auto' = the platform's fastest)",
      **_one_of(KERNEL_CHOICES),
  )
  remat: str = setting(
      'none',
      'what each layer keeps for the backward pass',
      **_one_of(REMAT_POLICIES),
  )
  scan_layers: bool = setting(False, 'the layers as one scanned layer')
  # The registered kinds' own settings that differ from their defaults, as
  # sorted (name, value) pairs (a mapping is taken too); see `setting`.
  extension_settings: Tuple[Tuple[str, Any], ...] = ()
  # Not a config field: the mesh a fused attention kernel runs over, per device,
  # set by `with_kernel_for` for a run on more than one device; see `kernel`.
  kernel_partition: Optional[MeshPartition] = None

  def __post_init__(self):
    settings_flags.check_fields(self, SETTINGS_SECTION)  # each field against its declaration
    self._validate()

  @classmethod
  def from_config(cls, model_config: Mapping[str, Any]) -> 'ModelConfig':
    """Builds the dataclass from `config.model`, rejecting unknown fields.

    A field a registered kind declares (`registry.Setting`) goes to
    `extension_settings`.
    """
    values = dict(model_config)
    known = {f.name for f in dataclasses.fields(cls)} - set(NOT_CONFIG_FIELDS)
    declared = registry.declared_settings(SETTINGS_SECTION)
    extension_fields = set(declared) - known  # a clash with a built-in field is refused later
    settings = {name: values.pop(name) for name in list(values) if name in extension_fields}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(
          f'Unknown field(s) config.model.{", config.model.".join(unknown)}; '
          f'known fields are: {", ".join(sorted(known | set(declared)))} (the setting of a '
          "kind of your own is known once config.extensions imports the kind's file)."
      )
    return cls(**values, extension_settings=settings)

  def to_dict(self) -> Dict[str, Any]:
    """The fields as config.model holds them, the kinds' settings included."""
    fields = {
        field.name: getattr(self, field.name)
        for field in dataclasses.fields(self)
        if field.name not in NOT_CONFIG_FIELDS
    }
    return {**fields, **dict(self.extension_settings)}

  def setting(self, name: str) -> Any:
    """The value of config.model.NAME, a setting a registered kind declares
    (its default unless the config sets it).

    Raises:
      ConfigError: no registered kind declares `name`.
    """
    return registry.declared_value(SETTINGS_SECTION, name, self.extension_settings, 'kind')

  def require_unscanned(self, reader: str) -> None:
    """A ConfigError if the layers are scanned: `reader` finds layers by name."""
    if self.scan_layers:
      raise ConfigError(
          f'{reader} reads layers by name (layers_0, layers_1, ...) and does not take a model '
          'with config.model.scan_layers=True; use a run trained with scan_layers=False.'
      )

  @property
  def head_dim(self) -> int:
    return self.hidden_dim // self.num_heads

  @property
  def attended_lengths(self) -> Tuple[int, ...]:
    """The query and key lengths the softmax attention sees: max_len, and the
    compressed length k of every layer where keys are projected."""
    if not self.attention_kind.uses_projection:
      return (self.max_len,)
    return (self.max_len,) + tuple(
        self.projected_len_for_layer(layer) for layer in range(self.num_layers)
    )

  def with_kernel_for(
      self, platform: str, partition: Optional[MeshPartition] = None
  ) -> Tuple['ModelConfig', str]:
    """This config with `attention_kernel` resolved for devices of `platform`
    ('auto' becomes a kernel), and why that kernel; a ConfigError if the
    explicit kernel cannot run there.

    `partition` is how the run's mesh splits the batch and heads; a fused
    kernel (`attention.FUSED_KERNELS`) keeps it, to run inside a shard_map
    over the mesh. A mesh of one device needs none.

    A causal model attends by its kind's own einsums (`causal_attention` and
    `decode` take no kernel), as does a kind without a softmax kernel
    (`AttentionKind.uses_kernel`), so there 'auto' is einsum on every platform.
    """
    if self.attention_kernel == AUTO_KERNEL and (
        self.causal or not self.attention_kind.uses_kernel
    ):
      model = 'a causal model' if self.causal else f'attention={self.attention!r}'
      why = f'auto: einsum on {platform}, since {model} attends by its own einsums'
      return dataclasses.replace(self, attention_kernel='einsum', kernel_partition=None), why
    try:
      kernel, why = kernel_for_platform(
          self.attention_kernel,
          platform,
          dtype=self.dtype,
          head_dim=self.head_dim,
          lengths=self.attended_lengths,
          attention_dropout=self.attention_dropout_rate,
      )
    except ValueError as error:
      raise ConfigError(str(error)) from None
    if kernel not in FUSED_KERNELS or partition is None or partition.mesh.size == 1:
      partition = None
    return dataclasses.replace(self, attention_kernel=kernel, kernel_partition=partition), why

  @property
  def kernel(self) -> Union[str, PartitionedKernel]:
    """What the layers attend with (`attention.attend_with`): the kernel's name,
    or the fused kernel with the mesh it runs over."""
    if self.kernel_partition is None:
      return self.attention_kernel
    return PartitionedKernel(self.attention_kernel, self.kernel_partition)

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  def projected_len_for_layer(self, layer: int) -> int:
    """The projected length k of one layer (k may differ per layer)."""
    if isinstance(self.projected_len, tuple):
      return self.projected_len[layer]
    return self.projected_len

  @property
  def attention_kind(self) -> attention_kinds.AttentionKind:
    """The registered kind `attention` names."""
    return attention_kinds.kind(self.attention)

  @property
  def projection_kind(self) -> projections.SequenceProjectionKind:
    """The registered sequence projection `projection` names."""
    return projections.REGISTRY.get(self.projection)(self.projection)

  @property
  def compressed_span(self) -> int:
    """The positions one compression covers: max_len, or a causal block."""
    return self.attention_kind.compressed_span(self)

  def window_for_layer(self, layer: int) -> int:
    """Pooling/convolution window of one layer: n / k, or block_len / r when causal."""
    return self.compressed_span // self.projected_len_for_layer(layer)

  def _validate(self) -> None:
    """What no single field's declaration can say: how the fields fit together
    and with the registered kinds."""
    if self.hidden_dim % self.num_heads:
      raise _field_error(
          'hidden_dim', self.hidden_dim, f'it must be divisible by num_heads={self.num_heads}'
      )
    attention_kind = self.attention_kind  # a ConfigError listing the names when unknown
    projection_kind = self.projection_kind
    self._validate_projection_init(projection_kind)
    self._validate_extension_settings()
    if self.causal and not attention_kind.supports_causal:
      raise _field_error(
          'causal', self.causal, f'attention={self.attention!r} has no left-to-right form'
      )
    if self.causal and attention_kind.uses_projection and not projection_kind.supports_causal:
      raise _field_error(
          'projection',
          self.projection,
          f'projection={self.projection!r} has no causal (block by block) form; it needs '
          'windowed=True or a block_summaries method',
      )
    if self.compressed_span != self.max_len and (
        self.block_len < 1 or self.max_len % self.block_len
    ):
      raise _field_error(
          'block_len',
          self.block_len,
          f'a causal Linformer needs blocks that divide max_len={self.max_len}',
      )
    per_layer = self.projected_len if isinstance(self.projected_len, tuple) else ()
    if self.scan_layers and len(set(per_layer)) > 1:
      raise _field_error(
          'scan_layers',
          self.scan_layers,
          f'scanned layers share one shape, so projected_len={self.projected_len} must be '
          'one k for every layer (or set --config.model.scan_layers=False)',
      )
    if self.attention_dropout_rate > 0 and not attention_kind.drops_attention_weights:
      raise _field_error(
          'attention_dropout_rate',
          self.attention_dropout_rate,
          f'attention={self.attention!r} has no attention weights it drops out; set '
          'model.attention_dropout_rate=0.0',
      )
    self._validate_projected_len(projection_kind)

  def _validate_projection_init(self, projection_kind: projections.SequenceProjectionKind) -> None:
    allowed = projection_kind.projection_inits
    if self.projection_init == '':
      # '' = the kind's own default: 'local' for 'linear' (docs/results_gutenberg.md).
      object.__setattr__(self, 'projection_init', projection_kind.default_projection_init)
    if self.projection_init not in allowed:
      raise _field_error(
          'projection_init',
          self.projection_init,
          f'use one of {allowed} for projection={self.projection!r}',
      )
    noise = self.projection_init_noise
    if noise and self.projection_init != 'local':
      raise _field_error(
          'projection_init_noise', noise, "it is noise on projection_init='local'; use 0.0 here"
      )

  def _validate_extension_settings(self) -> None:
    """Checks each setting against its declaration and keeps, sorted, those
    that differ from their defaults. A setting of a kind the config does not
    choose must keep its default: it would change nothing, silently."""
    declared = registry.declared_settings(SETTINGS_SECTION)
    chosen = {
        f'{SETTINGS_SECTION}.attention': self.attention,
        f'{SETTINGS_SECTION}.projection': self.projection,
    }
    clashes = sorted(set(declared) & {f.name for f in dataclasses.fields(self)})
    if clashes:
      raise ConfigError(
          f'config.model.{clashes[0]} is a built-in field; the setting that '
          f'{_owners_in_words(declared[clashes[0]].owners)} declares must be renamed.'
      )
    kept = {}
    for name, value in dict(self.extension_settings).items():
      if name not in declared:
        raise ConfigError(
            f'config.model.{name} is a setting no registered kind declares; import the file '
            'of the kind that declares it (config.extensions) or remove the field.'
        )
      setting, owners = declared[name]
      owned_by = _owners_in_words(owners)
      if not setting.allows(value):
        raise _field_error(name, value, f'{setting.allowed} (a setting of {owned_by})')
      value = setting.normalised(value)
      if value == setting.default:
        continue
      if not any(chosen.get(field) == owner for field, owner in owners):
        raise _field_error(
            name, value, f'it is a setting of {owned_by}, which this config does not use; remove it'
        )
      kept[name] = value
    object.__setattr__(self, 'extension_settings', tuple(sorted(kept.items())))

  def _validate_projected_len(self, projection_kind: projections.SequenceProjectionKind) -> None:
    per_layer = self.projected_len
    if isinstance(per_layer, tuple):
      if len(per_layer) != self.num_layers:
        raise _field_error(
            'projected_len', per_layer, f'give one int or exactly num_layers={self.num_layers} ints'
        )
      if (
          self.sharing in ('layerwise', 'kv')
          and self.attention_kind.uses_projection
          and len(set(per_layer)) > 1
      ):
        raise _field_error(
            'projected_len',
            per_layer,
            f"sharing='{self.sharing}' needs one k for every layer; use "
            "sharing='none' or 'headwise' for a different k per layer",
        )
    else:
      per_layer = (per_layer,)
    for k in per_layer:
      if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _field_error('projected_len', self.projected_len, 'use positive integers')
      span, span_name = self.compressed_span, 'max_len'
      if span != self.max_len:
        span_name = 'block_len'  # a causal Linformer compresses each block to k slots
      if k > span:
        raise _field_error(
            'projected_len', self.projected_len, f'k must be at most {span_name}={span}'
        )
      if projection_kind.windowed and span % k:
        raise _field_error(
            'projected_len',
            self.projected_len,
            f"projection='{self.projection}' needs {span_name}={span} to be "
            f'a multiple of k (window = stride = {span_name}/k); {span} % {k} != 0',
        )
      if self.projection_init == 'local' and span % k:
        raise _field_error(
            'projection_init',
            self.projection_init,
            f"'local' (the default of projection='linear') starts as projection='mean', whose "
            f'windows need {span_name}={span} to be a multiple of k; {span} % {k} != 0: use '
            "a k that divides it, or projection_init='jl'",
        )
