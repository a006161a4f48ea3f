"""The encoder's layers: sequence projections, self-attention, MLP, one layer.

The modules only hold parameters and call the pure functions of
`linformer_jax.model.attention` (bidirectional) and
`linformer_jax.model.causal_attention` (left to right, `config.causal`).

Parameter sharing of the sequence projections (the paper's Section 4):
  'none'      an E and an F per head and layer  (2 * heads * layers matrices)
  'headwise'  one E and one F per layer          (2 * layers)
  'kv'        one E = F per layer                (layers)
  'layerwise' one E = F for the whole model      (1)
A causal Linformer uses the same weights block by block: a matrix [max_len, r]
maps each block of `block_len` tokens into its own r slots, and a convolution
or pooling window is block_len / r.

Learned projections ('linear') start from the paper's Johnson-Lindenstrauss
construction, entries drawn from N(0, 1/k). 'random' projections are drawn the
same way but never trained: they live in the 'constants' collection, outside
'params', so no gradient or optimizer update ever reaches them while they are
still saved with the model's variables.

Decoding (`decode_position` given) reads one token per call and keeps what
later tokens need in the 'cache' collection: the keys and values of every
position for full attention; the current block and the finished blocks'
summaries for the causal Linformer (`causal_attention.DecodeCache`).
"""

from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import causal_attention
from linformer_jax.model import logical_axes as axes
from linformer_jax.model.model_config import ModelConfig

Array = jax.Array
# Variable collection of the state that decoding carries from token to token.
CACHE = 'cache'

# Variable collection of the fixed (untrained) random projections.
CONSTANTS = 'constants'
DENSE_INIT = nn.initializers.normal(stddev=0.02)
# Names of the sequence-projection weights, E and F.
PROJECTION_NAMES = ('kv_projection', 'key_projection', 'value_projection')


def johnson_lindenstrauss_init(projected_len: int):
  """Initialiser with entries from N(0, 1/k), the paper's JL construction."""
  return nn.initializers.normal(stddev=projected_len**-0.5)


def partitioned(init, names):
  return nn.with_logical_partitioning(init, names)


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

  Attributes:
    config: the model configuration.
    projected_len: k for the layer(s) using these weights.
    per_head: one weight per head (sharing 'none') or one for all heads.
    share_key_value: one weight used as both E and F ('kv', 'layerwise').

  Returns (from __call__) the pair (E, F); E is F when shared. Weights are
  [max_len, k] matrices for 'linear'/'random', [window, head_dim, head_dim]
  convolution kernels for 'conv' (a leading heads axis when per_head), and
  None for pooling.
  """

  config: ModelConfig
  projected_len: int
  per_head: bool
  share_key_value: bool

  def _weight(self, name: str) -> Optional[Array]:
    cfg = self.config
    heads = (cfg.num_heads,) if self.per_head else ()
    # Not axes.HEADS: projections stay replicated unless a rule names them.
    head_axes = (axes.PROJECTION_HEADS,) if self.per_head else ()
    if cfg.projection in ('linear', 'random'):
      shape = heads + (cfg.max_len, self.projected_len)
      names = head_axes + (axes.LENGTH, axes.PROJECTED_LENGTH)
      init = partitioned(johnson_lindenstrauss_init(self.projected_len), names)
      if cfg.projection == 'linear':
        return self.param(name, init, shape, jnp.float32)
      return self.variable(
          CONSTANTS, name, lambda: init(self.make_rng('params'), shape, jnp.float32)
      ).value
    if cfg.projection == 'conv':
      window = cfg.compressed_span // self.projected_len
      shape = heads + (window, cfg.head_dim, cfg.head_dim)
      names = head_axes + (axes.CONV_WINDOW, axes.HEAD_DIM_IN, axes.HEAD_DIM)
      fan_in = nn.initializers.variance_scaling(
          1.0, 'fan_in', 'normal', in_axis=(-3, -2), out_axis=-1
      )
      return self.param(name, partitioned(fan_in, names), shape, jnp.float32)
    return None

  @nn.compact
  def __call__(self) -> Tuple[Optional[Array], Optional[Array]]:
    if self.share_key_value:
      shared = self._weight('kv_projection')
      return shared, shared
    return self._weight('key_projection'), self._weight('value_projection')


# Projections whose compression commutes with the key/value projection.
COMPRESS_FIRST_PROJECTIONS = ('linear', 'random', 'mean')


class SelfAttention(nn.Module):
  """Multi-head self-attention, full or Linformer, bidirectional or causal.

  A bidirectional Linformer whose E and F are shared by the heads (any sharing
  but 'none') and linear or mean pooling compresses the layer input first and
  projects the k compressed rows to keys and values
  (`attention.compress_layer_input`): the same result with the key and value
  matmuls on k rows instead of n, and one compression for E = F. The
  parameters are the same either way. Bidirectional inference passes with
  `config.inference_chunk` attend chunk by chunk of queries (`in_chunks`).

  Attributes:
    config: the model configuration.
    layer: this layer's index.
    compress_first: False projects every position, then compresses (the
      reference order, for tests).
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
    weights, projected_len = (None, None), None
    if cfg.attention == 'linformer':
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
    key_weight, value_weight = weights
    if decode_position is not None or cfg.causal:
      q, k, v = query_dense(x), key_dense(x), value_dense(x)
      if decode_position is not None:
        out = self._decode(q, k, v, decode_position, projected_len, key_weight, value_weight)
      elif cfg.attention == 'full':
        out = attention.dot_product_attention(q, k, v, key_padding_mask=padding_mask, causal=True)
      else:
        out = causal_attention.causal_block_attention(
            q,
            k,
            v,
            block=cfg.block_len,
            slots=projected_len,
            projection=cfg.projection,
            key_weight=key_weight,
            value_weight=value_weight,
            key_padding_mask=padding_mask,
            query_blocks_per_step=cfg.query_blocks_per_step or None,
        )
      return dropout(out_dense(out), deterministic=deterministic)
    common = dict(max_len=cfg.max_len, projected_len=projected_len, key_padding_mask=padding_mask)
    if (
        self.compress_first
        and cfg.attention == 'linformer'
        and cfg.sharing != 'none'
        and cfg.projection in COMPRESS_FIRST_PROJECTIONS
    ):
      compressed = attention.compress_layer_input(x, cfg.projection, key_weight, name='E', **common)
      if value_weight is not key_weight:
        value_input = attention.compress_layer_input(
            x, cfg.projection, value_weight, name='F', **common
        )
      else:
        value_input = compressed
      keys = _project_compressed(key_dense, *compressed[:2])
      values = _project_compressed(value_dense, *value_input[:2])
      key_mask = compressed[2]
      # The compressed keys, for analyses that capture intermediates (spectrum).
      self.sow('intermediates', 'compressed_keys', (keys, key_mask))
    else:
      keys, values, key_mask = key_dense(x), value_dense(x), padding_mask
      if cfg.attention == 'linformer':
        keys, key_mask = attention.compress_sequence(
            keys, cfg.projection, key_weight, name='E', **common
        )
        values, _ = attention.compress_sequence(
            values, cfg.projection, value_weight, name='F', **common
        )

    kernel = cfg.attention_kernel
    chunk = inference_chunk(cfg, x.shape[1], deterministic)
    if chunk is None or self.is_initializing():
      out = out_dense(attention.attend_with(kernel, query_dense(x), keys, values, key_mask))
    else:  # queries chunk by chunk: temporaries of chunk x (k or n) per head
      query, output = pure(query_dense), pure(out_dense)
      out = in_chunks(
          lambda rows: output(attention.attend_with(kernel, query(rows), keys, values, key_mask)),
          x,
          chunk,
      )
    return dropout(out, deterministic=deterministic)

  def _decode(self, q, k, v, position, projected_len, key_weight, value_weight) -> Array:
    """Attention of one token [batch, 1, ...] at `position`, through the cache."""
    cfg = self.config
    batch = q.shape[0]
    if not cfg.causal:
      raise ValueError(
          'Decoding needs a causal model; set config.model.causal=True (config.task=causal_lm).'
      )
    if cfg.attention == 'full':
      shape = (batch, cfg.max_len, cfg.num_heads, cfg.head_dim)
      cached_keys = self.variable(CACHE, 'keys', jnp.zeros, shape, k.dtype)
      cached_values = self.variable(CACHE, 'values', jnp.zeros, shape, v.dtype)
      start = (0, position, 0, 0)
      keys = jax.lax.dynamic_update_slice(cached_keys.value, k, start)
      values = jax.lax.dynamic_update_slice(cached_values.value, v, start)
      visible = jnp.broadcast_to(jnp.arange(cfg.max_len) <= position, (batch, cfg.max_len))
      if not self.is_initializing():
        cached_keys.value, cached_values.value = keys, values
      return attention.attend(q, keys, values, visible)
    settings = dict(block=cfg.block_len, slots=projected_len)
    state = self.variable(
        CACHE,
        'blocks',
        lambda: causal_attention.init_decode_cache(
            batch, cfg.max_len, cfg.num_heads, cfg.head_dim, dtype=k.dtype, **settings
        )._asdict(),
    )
    out, new_state = causal_attention.decode_step(
        causal_attention.DecodeCache(**state.value),
        q,
        k,
        v,
        position,
        projection=cfg.projection,
        key_weight=key_weight,
        value_weight=value_weight,
        **settings,
    )
    if not self.is_initializing():
      state.value = new_state._asdict()
    return out


def _project_compressed(projection: nn.DenseGeneral, rows: Array, bias_factor: Array) -> Array:
  """Keys or values from compressed input rows: rows W + bias_factor * b."""
  out = projection(rows)
  bias = nn.meta.unbox(projection.variables['params']['bias'])
  correction = (bias_factor - 1.0)[:, :, None, None] * bias.astype(jnp.float32)
  return (out.astype(jnp.float32) + correction).astype(out.dtype)


def inference_chunk(cfg: ModelConfig, length: int, deterministic: bool) -> Optional[int]:
  """Positions per chunk of a chunked inference pass, None for one pass.

  `config.inference_chunk` > 0 runs queries and the MLP chunk by chunk in
  deterministic (inference) passes of bidirectional models: the same outputs,
  with temporaries of O(chunk x k) for Linformer attention and O(chunk x n)
  for full attention instead of O(n x k) and O(n x n). Training keeps one
  pass (backpropagation would keep every chunk's activations anyway).
  """
  chunk = cfg.inference_chunk
  if not chunk or not deterministic or cfg.causal or chunk >= length:
    return None
  return chunk


def pure(module: nn.Module):
  """A bound submodule as a pure function of its inputs, with its parameters.

  What `jax.lax.map` needs to run it inside a loop body.
  """
  unbound, variables = module.clone(parent=None), module.variables
  return lambda *args: unbound.apply(variables, *args)


def in_chunks(fn, x: Array, chunk: Optional[int]) -> Array:
  """fn (a pure function of rows) over x [batch, length, ...], chunk by chunk.

  A `jax.lax.map` over chunks, so XLA runs them one after another and one
  chunk's temporaries are reused by the next. The last chunk is padded with
  copies of the final rows; fn must treat rows independently (queries, the
  MLP), so the padding is dropped from the output.
  """
  if chunk is None:
    return fn(x)
  batch, length = x.shape[:2]
  num_chunks = -(-length // chunk)
  padding = num_chunks * chunk - length
  if padding:
    x = jnp.concatenate([x, jnp.repeat(x[:, -1:], padding, axis=1)], axis=1)
  chunks = jnp.moveaxis(x.reshape(batch, num_chunks, chunk, *x.shape[2:]), 1, 0)
  out = jax.lax.map(fn, chunks)
  out = jnp.moveaxis(out, 0, 1).reshape(batch, num_chunks * chunk, *out.shape[3:])
  return out[:, :length]


class FeedForward(nn.Module):
  """The position-wise GELU MLP."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = cfg.compute_dtype
    h = dense(cfg.mlp_dim, (axes.EMBED,), (axes.MLP,), name='wi', dtype=dtype)(x)
    h = nn.gelu(h, approximate=False)
    h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
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
      mlp, norm = (lambda rows: feed_forward(rows, deterministic)), mlp_norm
    else:  # the MLP chunk by chunk: temporaries of chunk x mlp_dim
      mlp, norm = (lambda rows, ff=pure(feed_forward): ff(rows, True)), pure(mlp_norm)
    if cfg.pre_layer_norm:
      return in_chunks(lambda rows: rows + mlp(norm(rows)), x, chunk)
    return in_chunks(lambda rows: norm(rows + mlp(rows)), x, chunk)
