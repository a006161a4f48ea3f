"""The encoder's layers: sequence projections, self-attention, MLP, one layer.

The modules only hold parameters and call the attention kind and the sequence
projection the config names (`linformer_jax.model.attention_kinds`,
`linformer_jax.model.projections`), whose math is pure functions.

Parameter sharing of the sequence projections (the paper's Section 4):
  'none'      an E and an F per head and layer  (2 * heads * layers matrices)
  'headwise'  one E and one F per layer          (2 * layers)
  'kv'        one E = F per layer                (layers)
  'layerwise' one E = F for the whole model      (1)
A causal Linformer uses the same weights block by block: a matrix [max_len, r]
maps each block of `block_len` tokens into its own r slots, and a convolution
or pooling window is block_len / r.

The weights themselves are the projection kind's: learned matrices ('linear',
from the paper's Johnson-Lindenstrauss construction or as
`config.model.projection_init` says), the JL matrices never trained ('random',
in the 'constants' collection), convolution kernels ('conv'). An attention
kind's own fixed arrays (`AttentionKind.constants`, the Performer's random
features) are in the 'constants' collection too. Kinds declare what they hold
(`Parameter`, `Constant`: `linformer_jax.model.declarations`) and the layers
create it, all through `declared_variable`.

Dropout is RoBERTa's (fairseq's `dropout`, `attention_dropout` and
`activation_dropout`): `dropout_rate` on the embeddings and on each residual
branch (the attention output and the MLP output), `attention_dropout_rate` on
the attention weights P inside the kind's softmax ([n, k] for a Linformer,
[n, n] for the Transformer), `activation_dropout_rate` on the MLP's GELU
output, 0 by default.

Decoding (`decode_position` given) reads one token per call and keeps what
later tokens need in the 'cache' collection, as the attention kind lays it
out: the keys and values of every position for full attention; the current
block and the finished blocks' summaries for the causal Linformer.
"""

import functools
from typing import Optional, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.model import attention_kinds
from linformer_jax.model import logical_axes as axes
from linformer_jax.model import projections
from linformer_jax.model.declarations import CONSTANTS
from linformer_jax.model.declarations import Constant
from linformer_jax.model.declarations import Parameter
from linformer_jax.model.inference_chunks import in_chunks
from linformer_jax.model.inference_chunks import inference_chunk
from linformer_jax.model.inference_chunks import pure
from linformer_jax.model.model_config import ModelConfig

# model.remat -> the jax.checkpoint policy of each encoder layer (None: no remat).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

Array = jax.Array
# Variable collection of the state that decoding carries from token to token.
CACHE = 'cache'
DENSE_INIT = nn.initializers.normal(stddev=0.02)
# Names of the sequence-projection weights, E and F.
PROJECTION_NAMES = ('kv_projection', 'key_projection', 'value_projection')
# The attention layer's own submodules; a kind's parameters take other names.
ATTENTION_SUBMODULES = ('query', 'key', 'value', 'out', 'projection')
# The name of the encoder's nn.scan over its layers (model.scan_layers): every
# variable under it has a leading axis of num_layers.
SCANNED_LAYERS = 'layers'


def partitioned(init, names):
  return nn.with_logical_partitioning(init, names)


def declared_variable(
    module: nn.Module, name: str, declared: Union[Parameter, Constant], owner: str
) -> Array:
  """Creates the weight a kind declares in `module`'s compact call, float32.

  A `Parameter` is a variable of 'params', trained; a `Constant` one of
  `CONSTANTS`, drawn once when the model is initialised, with a key of the
  'params' stream (so the run's seed decides it), and never trained. Either
  carries its logical axes; a Constant without axes is replicated.

  Args:
    module: the Flax module holding the weight.
    name: its variable name.
    declared: the `Parameter` or `Constant`.
    owner: who declared it, for messages, e.g. "attention='performer'".

  Returns:
    The weight's value.

  Raises:
    ConfigError: axes that do not name each dimension of the shape.
  """
  shape = tuple(declared.shape)
  what = 'parameter' if isinstance(declared, Parameter) else 'constant'
  if declared.axes is not None and len(declared.axes) != len(shape):
    raise ConfigError(
        f'{owner}: {what} {name!r} of shape {declared.shape} needs one logical axis name per '
        f'dimension, not {declared.axes}.'
    )
  init = declared.init
  if declared.axes is not None:
    init = partitioned(init, tuple(declared.axes))
  if isinstance(declared, Parameter):
    return module.param(name, init, shape, jnp.float32)

  def draw():  # called at init only: a restored constant keeps its values
    return init(module.make_rng('params'), shape, jnp.float32)

  return module.variable(CONSTANTS, name, draw).value


def dense(
    features, in_axes: Tuple[str, ...], out_axes: Tuple[str, ...], *, name: str, dtype, axis=-1
) -> nn.DenseGeneral:
  """A float32-parameter dense layer whose kernel carries the logical axes
  in_axes + out_axes and whose bias carries out_axes."""
  return nn.DenseGeneral(
      features,
      axis=axis,
      dtype=dtype,
      param_dtype=jnp.float32,
      name=name,
      kernel_init=partitioned(DENSE_INIT, in_axes + out_axes),
      bias_init=partitioned(nn.initializers.zeros, out_axes),
  )


def layer_norm(name: str, cfg: ModelConfig) -> nn.LayerNorm:
  """A layer norm of the model's epsilon and compute dtype, float32 parameters."""
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_epsilon,
      dtype=cfg.compute_dtype,
      param_dtype=jnp.float32,
      name=name,
      scale_init=partitioned(nn.initializers.ones, (axes.EMBED,)),
      bias_init=partitioned(nn.initializers.zeros, (axes.EMBED,)),
  )


class SequenceProjection(nn.Module):
  """Holds the E/F weights that compress keys and values along the sequence.

  The projection kind (`config.model.projection`) decides what the weights
  are: [max_len, k] matrices for 'linear' and 'random', [window, head_dim,
  head_dim] convolution kernels for 'conv', none for pooling; a per-head
  weight has a leading heads axis.

  Attributes:
    config: the model configuration.
    projected_len: k for the layer(s) using these weights.
    per_head: one weight per head (sharing 'none') or one for all heads.
    share_key_value: one weight used as both E and F ('kv', 'layerwise').

  Returns (from __call__) the pair (E, F); E is F when shared, None for a
  kind without weights.
  """

  config: ModelConfig
  projected_len: int
  per_head: bool
  share_key_value: bool

  def _weight(self, name: str) -> Optional[Array]:
    kind = self.config.projection_kind
    sizes = dict(config=self.config, projected_len=self.projected_len, per_head=self.per_head)
    declared = kind.check_weight(kind.weight(**sizes), name, **sizes)
    if declared is None:
      return None
    return declared_variable(self, name, declared, f'projection={kind.name!r}')

  @nn.compact
  def __call__(self) -> Tuple[Optional[Array], Optional[Array]]:
    if self.share_key_value:
      shared = self._weight('kv_projection')
      return shared, shared
    return self._weight('key_projection'), self._weight('value_projection')


class SelfAttention(nn.Module):
  """Multi-head self-attention of the configured kind, bidirectional or causal.

  The layer holds the query, key, value and output dense layers, the
  sequence projection's weights, and the parameters and fixed arrays the
  attention kind declares (`AttentionKind.parameters` and `constants`, bound
  to the kind before any pass);
  the kind (`config.model.attention`, see `attention_kinds`) does the rest:
  the keys and values queries attend over, the causal pass, decoding through
  the cache. Bidirectional inference passes with `config.inference_chunk`
  attend chunk by chunk of queries (`in_chunks`).

  Attributes:
    config: the model configuration.
    layer: this layer's index.
    compress_first: False projects every position, then compresses (the
      reference order, for tests); True lets a projection that commutes with
      the dense layers compress the layer input first.
  """

  config: ModelConfig
  layer: int
  compress_first: bool = True

  @nn.compact
  def __call__(
      self,
      x: Array,
      padding_mask: Optional[Array],
      shared_projection: Tuple[Optional[Array], Optional[Array]],
      deterministic: bool,
      decode_position: Optional[Array] = None,
  ) -> Array:
    cfg = self.config
    dtype = cfg.compute_dtype
    kind = self._attention_kind()
    if cfg.attention_dropout_rate > 0 and not deterministic and decode_position is None:
      # A key per layer and step, from the 'dropout' stream the other dropouts draw on.
      weight_dropout = attention.WeightDropout(cfg.attention_dropout_rate, self.make_rng('dropout'))
      kind = kind.with_weight_dropout(weight_dropout)

    query_dense, key_dense, value_dense = (
        dense(
            (cfg.num_heads, cfg.head_dim),
            (axes.EMBED,),
            (axes.HEADS, axes.HEAD_DIM),
            name=name,
            dtype=dtype,
        )
        for name in ('query', 'key', 'value')
    )
    out_dense = dense(
        cfg.hidden_dim,
        (axes.HEADS, axes.HEAD_DIM),
        (axes.EMBED,),
        name='out',
        dtype=dtype,
        axis=(-2, -1),
    )
    dropout = nn.Dropout(cfg.dropout_rate)
    projection = self._projection(shared_projection) if kind.uses_projection else None
    if decode_position is not None or cfg.causal:
      q, k, v = query_dense(x), key_dense(x), value_dense(x)
      if decode_position is not None:
        out = self._decode(kind, q, k, v, decode_position, projection)
      else:
        out = kind.causal_attention(q, k, v, padding_mask, projection, cfg)
      return dropout(out_dense(out), deterministic=deterministic)

    layer_dense = attention_kinds.KeyValueDense(
        keys=key_dense,
        values=value_dense,
        keys_from_compressed=functools.partial(_project_compressed, key_dense),
        values_from_compressed=functools.partial(_project_compressed, value_dense),
    )
    keys, values, key_mask = kind.keys_and_values(
        x,
        padding_mask,
        layer_dense,
        projection,
        cfg,
        compress_first=self.compress_first,
        record=functools.partial(self.sow, 'intermediates'),
    )
    kernel = cfg.kernel
    chunk = inference_chunk(cfg, x.shape[1], deterministic)
    if chunk is None or self.is_initializing() or not kind.queries_independent:
      out = out_dense(kind.attend(query_dense(x), keys, values, key_mask, kernel=kernel))
    else:  # queries chunk by chunk: temporaries of chunk x (k or n) per head
      query, output = pure(query_dense), pure(out_dense)
      out = in_chunks(
          lambda rows: output(kind.attend(query(rows), keys, values, key_mask, kernel=kernel)),
          x,
          chunk,
      )
    return dropout(out, deterministic=deterministic)

  def _attention_kind(self) -> attention_kinds.AttentionKind:
    """The configured kind, holding the layer's config and its values of the
    parameters and fixed arrays it declares (`AttentionKind.parameters` and
    `constants`)."""
    kind = self.config.attention_kind
    owner = f'attention={kind.name!r}'
    values = {}
    for name, parameter in kind.parameters(self.config).items():
      if name in ATTENTION_SUBMODULES:
        raise ValueError(
            f'{owner} declares a parameter {name!r}, the name of one of the '
            f"layer's own weights {ATTENTION_SUBMODULES}; rename it."
        )
      values[name] = declared_variable(self, name, parameter, owner)
    constant_values = {}
    for name, constant in kind.constants(self.config).items():
      if name in ATTENTION_SUBMODULES or name in values:
        raise ValueError(
            f'{owner} declares a constant {name!r}, the name of one of the '
            f"layer's own weights {ATTENTION_SUBMODULES} or of one of its parameters; rename it."
        )
      constant_values[name] = declared_variable(self, name, constant, owner)
    return kind.with_parameters(values).with_constants(constant_values).with_config(self.config)

  def _projection(self, shared_projection) -> projections.LayerProjection:
    """This layer's sequence projection: the model's shared weights or its own."""
    cfg = self.config
    projected_len = cfg.projected_len_for_layer(self.layer)
    if cfg.sharing == 'layerwise':
      weights = shared_projection
    else:
      weights = SequenceProjection(
          cfg,
          projected_len,
          per_head=cfg.sharing == 'none',
          share_key_value=cfg.sharing == 'kv',
          name='projection',
      )()
    return projections.LayerProjection(cfg.projection_kind, projected_len, *weights)

  def _decode(self, kind, q, k, v, position, projection) -> Array:
    """Attention of one token [batch, 1, ...] at `position`, through the cache."""
    cfg = self.config
    if not cfg.causal:
      raise ValueError(
          'Decoding needs a causal model; set config.model.causal=True (config.task=causal_lm).'
      )
    empty = kind.init_cache(q.shape[0], cfg, projection, k.dtype)
    cache = {
        name: self.variable(CACHE, name, lambda initial=value: initial)
        for name, value in empty.items()
    }
    values = {name: variable.value for name, variable in cache.items()}
    out, new_cache = kind.decode(values, q, k, v, position, projection, cfg)
    if not self.is_initializing():
      for name, variable in cache.items():
        variable.value = new_cache[name]
    return out


def _project_compressed(projection: nn.DenseGeneral, rows: Array, bias_factor: Array) -> Array:
  """Keys or values from compressed input rows: rows W + bias_factor * b."""
  out = projection(rows)
  bias = nn.meta.unbox(projection.variables['params']['bias'])
  correction = (bias_factor - 1.0)[:, :, None, None] * bias.astype(jnp.float32)
  return (out.astype(jnp.float32) + correction).astype(out.dtype)


class FeedForward(nn.Module):
  """The position-wise GELU MLP."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = cfg.compute_dtype
    h = dense(cfg.mlp_dim, (axes.EMBED,), (axes.MLP,), name='wi', dtype=dtype)(x)
    h = nn.gelu(h, approximate=False)
    # RoBERTa's activation dropout, 0 by default; dropout_rate is the branch's.
    h = nn.Dropout(cfg.activation_dropout_rate)(h, deterministic=deterministic)
    h = dense(cfg.hidden_dim, (axes.MLP,), (axes.EMBED,), name='wo', dtype=dtype)(h)
    return nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)


class EncoderLayer(nn.Module):
  """Attention and MLP blocks with residuals, post-LN (RoBERTa) or pre-LN."""

  config: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x, padding_mask, shared_projection, deterministic, decode_position=None):
    cfg = self.config
    attend = SelfAttention(cfg, self.layer, name='attention')
    feed_forward = FeedForward(cfg, name='mlp')
    attention_norm = layer_norm('attention_norm', cfg)
    mlp_norm = layer_norm('mlp_norm', cfg)
    context = (shared_projection, deterministic, decode_position)
    chunk = inference_chunk(cfg, x.shape[1], deterministic)
    if cfg.pre_layer_norm:
      x = x + attend(attention_norm(x), padding_mask, *context)
    else:
      x = attention_norm(x + attend(x, padding_mask, *context))
    if chunk is None or self.is_initializing():
      # Initialisation creates the MLP's parameters, which no loop body may do.
      chunk = None
      mlp, norm = (lambda rows: feed_forward(rows, deterministic)), mlp_norm
    else:  # the MLP chunk by chunk: temporaries of chunk x mlp_dim
      mlp, norm = (lambda rows, ff=pure(feed_forward): ff(rows, True)), pure(mlp_norm)
    if cfg.pre_layer_norm:
      return in_chunks(lambda rows: rows + mlp(norm(rows)), x, chunk)
    return in_chunks(lambda rows: norm(rows + mlp(rows)), x, chunk)


def encoder_layer_class(cfg: ModelConfig):
  """EncoderLayer, or with model.remat its rematerialised form: the backward
  pass recomputes what the policy does not keep. Parameter names are the same."""
  policy = REMAT_POLICIES[cfg.remat]
  if policy is None:
    return EncoderLayer
  # Argument 4 (self is 0) is `deterministic`, a Python bool.
  return nn.remat(EncoderLayer, policy=policy, static_argnums=(4,))


class ScannedLayer(nn.Module):
  """One step of `nn.scan` over the encoder layers: (x, ...) -> (x, None)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x, padding_mask, shared_projection, deterministic, decode_position=None):
    layer = encoder_layer_class(self.config)(self.config, 0, name='layer')
    return layer(x, padding_mask, shared_projection, deterministic, decode_position), None


def scanned_layers(cfg: ModelConfig, name: str) -> nn.Module:
  """All encoder layers as one `nn.scan`: each parameter (and constant and
  decoding cache) gains a leading axis of num_layers, logical axis `layers`;
  the layer is compiled once. The call is (x, padding_mask, shared_projection,
  deterministic, decode_position) -> (x, None)."""
  return nn.scan(
      ScannedLayer,
      # Constants are per layer too ('random' E/F, a kind's fixed arrays), each
      # layer's drawn with its own split of the 'params' key.
      variable_axes={'params': 0, CONSTANTS: 0, 'cache': 0},
      split_rngs={'params': True, 'dropout': True},
      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
      length=cfg.num_layers,
      metadata_params={nn.PARTITION_NAME: axes.LAYERS},
  )(cfg, name=name)
