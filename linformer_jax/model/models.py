"""Flax modules of the RoBERTa-style encoder with full or Linformer attention.

The modules only hold parameters and call the pure functions of
`linformer_jax.model.attention`. One `ModelConfig` selects everything an ablation
changes: `attention` ('full' is the Transformer baseline, same code otherwise),
the projected length k (one or per layer), the parameter sharing mode and the
sequence projection.

Parameter sharing of the sequence projections (the paper's Section 4):
  'none'      an E and an F per head and layer  (2 * heads * layers matrices)
  'headwise'  one E and one F per layer          (2 * layers)
  'kv'        one E = F per layer                (layers)
  'layerwise' one E = F for the whole model      (1)

Learned projections ('linear') start from the paper's Johnson-Lindenstrauss
construction, entries drawn from N(0, 1/k). 'random' projections are drawn the
same way but never trained: they live in the 'constants' collection, outside
'params', so no gradient or optimizer update ever reaches them while they are
still saved with the model's variables.

Parameters stay float32; `dtype='bfloat16'` only changes the compute dtype.
Every parameter carries logical axis names (see `logical_axes.py`) for sharding.
"""

import math
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import logical_axes as axes
from linformer_jax.model.model_config import ModelConfig

Array = jax.Array
# Variable collection of the fixed (untrained) random projections.
CONSTANTS = 'constants'
_DENSE_INIT = nn.initializers.normal(stddev=0.02)
# Names of the sequence-projection weights, E and F.
PROJECTION_NAMES = ('kv_projection', 'key_projection', 'value_projection')


def johnson_lindenstrauss_init(projected_len: int):
  """Initialiser with entries from N(0, 1/k), the paper's JL construction."""
  return nn.initializers.normal(stddev=projected_len**-0.5)


def _partitioned(init, names):
  return nn.with_logical_partitioning(init, names)


def _dense(
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
      kernel_init=_partitioned(_DENSE_INIT, in_axes + out_axes),
      bias_init=_partitioned(nn.initializers.zeros, out_axes),
  )


def _layer_norm(name: str, dtype) -> nn.LayerNorm:
  return nn.LayerNorm(
      epsilon=1e-5,
      dtype=dtype,
      param_dtype=jnp.float32,
      name=name,
      scale_init=_partitioned(nn.initializers.ones, (axes.EMBED,)),
      bias_init=_partitioned(nn.initializers.zeros, (axes.EMBED,)),
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
      init = _partitioned(johnson_lindenstrauss_init(self.projected_len), names)
      if cfg.projection == 'linear':
        return self.param(name, init, shape, jnp.float32)
      return self.variable(
          CONSTANTS, name, lambda: init(self.make_rng('params'), shape, jnp.float32)
      ).value
    if cfg.projection == 'conv':
      window = cfg.max_len // self.projected_len
      shape = heads + (window, cfg.head_dim, cfg.head_dim)
      names = head_axes + (axes.CONV_WINDOW, axes.HEAD_DIM_IN, axes.HEAD_DIM)
      fan_in = nn.initializers.variance_scaling(
          1.0, 'fan_in', 'normal', in_axis=(-3, -2), out_axis=-1
      )
      return self.param(name, _partitioned(fan_in, names), shape, jnp.float32)
    return None

  @nn.compact
  def __call__(self) -> Tuple[Optional[Array], Optional[Array]]:
    if self.share_key_value:
      shared = self._weight('kv_projection')
      return shared, shared
    return self._weight('key_projection'), self._weight('value_projection')


class SelfAttention(nn.Module):
  """Multi-head self-attention, full or Linformer, for one layer."""

  config: ModelConfig
  layer: int

  @nn.compact
  def __call__(
      self,
      x: Array,
      padding_mask: Optional[Array],
      shared_projection: Tuple[Optional[Array], Optional[Array]],
      deterministic: bool,
  ) -> Array:
    cfg = self.config
    dtype = cfg.compute_dtype

    q, k, v = (
        _dense(
            (cfg.num_heads, cfg.head_dim),
            (axes.EMBED,),
            (axes.HEADS, axes.HEAD_DIM),
            name=name,
            dtype=dtype,
        )(x)
        for name in ('query', 'key', 'value')
    )
    if cfg.attention == 'full':
      out = attention.dot_product_attention(q, k, v, key_padding_mask=padding_mask)
    else:
      projected_len = cfg.projected_len_for_layer(self.layer)
      if cfg.sharing == 'layerwise':
        key_weight, value_weight = shared_projection
      else:
        key_weight, value_weight = SequenceProjection(
            cfg,
            projected_len,
            per_head=cfg.sharing == 'none',
            share_key_value=cfg.sharing == 'kv',
            name='projection',
        )()
      out = attention.compressed_attention(
          q,
          k,
          v,
          projection=cfg.projection,
          key_weight=key_weight,
          value_weight=value_weight,
          max_len=cfg.max_len,
          projected_len=projected_len,
          key_padding_mask=padding_mask,
      )
    out = _dense(
        cfg.hidden_dim,
        (axes.HEADS, axes.HEAD_DIM),
        (axes.EMBED,),
        name='out',
        dtype=dtype,
        axis=(-2, -1),
    )(out)
    return nn.Dropout(cfg.dropout_rate)(out, deterministic=deterministic)


class FeedForward(nn.Module):
  """The position-wise GELU MLP."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = cfg.compute_dtype
    h = _dense(cfg.mlp_dim, (axes.EMBED,), (axes.MLP,), name='wi', dtype=dtype)(x)
    h = nn.gelu(h, approximate=False)
    h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
    h = _dense(cfg.hidden_dim, (axes.MLP,), (axes.EMBED,), name='wo', dtype=dtype)(h)
    return nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)


class EncoderLayer(nn.Module):
  """Attention and MLP blocks with residuals, post-LN (RoBERTa) or pre-LN."""

  config: ModelConfig
  layer: int

  @nn.compact
  def __call__(self, x, padding_mask, shared_projection, deterministic):
    cfg = self.config
    dtype = cfg.compute_dtype
    attend = SelfAttention(cfg, self.layer, name='attention')
    feed_forward = FeedForward(cfg, name='mlp')
    if cfg.pre_layer_norm:
      x = x + attend(
          _layer_norm('attention_norm', dtype)(x), padding_mask, shared_projection, deterministic
      )
      return x + feed_forward(_layer_norm('mlp_norm', dtype)(x), deterministic)
    x = _layer_norm('attention_norm', dtype)(
        x + attend(x, padding_mask, shared_projection, deterministic)
    )
    return _layer_norm('mlp_norm', dtype)(x + feed_forward(x, deterministic))


class Encoder(nn.Module):
  """Token + learned position embeddings and a stack of encoder layers."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.token_embedding = nn.Embed(
        cfg.vocab_size,
        cfg.hidden_dim,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        embedding_init=_partitioned(_DENSE_INIT, (axes.VOCAB, axes.EMBED)),
    )
    self.position_embedding = self.param(
        'position_embedding',
        _partitioned(_DENSE_INIT, (axes.LENGTH, axes.EMBED)),
        (cfg.max_len, cfg.hidden_dim),
        jnp.float32,
    )
    if cfg.num_segments:
      # Zeros: a pretrained encoder without segments starts out unchanged.
      self.segment_embedding = self.param(
          'segment_embedding',
          _partitioned(nn.initializers.zeros, (axes.SEGMENTS, axes.EMBED)),
          (cfg.num_segments, cfg.hidden_dim),
          jnp.float32,
      )
    self.embedding_norm = _layer_norm('embedding_norm', cfg.compute_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if cfg.attention == 'linformer' and cfg.sharing == 'layerwise':
      self.shared_projection = SequenceProjection(
          cfg, cfg.projected_len_for_layer(0), per_head=False, share_key_value=True
      )
    self.layers = [EncoderLayer(cfg, i) for i in range(cfg.num_layers)]
    if cfg.pre_layer_norm:
      self.final_norm = _layer_norm('final_norm', cfg.compute_dtype)

  def __call__(
      self,
      tokens: Array,
      padding_mask: Optional[Array] = None,
      *,
      segments: Optional[Array] = None,
      deterministic: bool = True,
  ) -> Array:
    """Encodes tokens [batch, length] into [batch, length, hidden_dim].

    Args:
      tokens: int token ids, length at most max_len.
      padding_mask: optional [batch, length] boolean, True for real tokens.
      segments: optional [batch, length] int segment ids (0 = first sentence);
        used when config.num_segments > 0 (all 0 when not given), ignored
        otherwise (RoBERTa tells sentences apart by the separator alone).
      deterministic: disables dropout (evaluation).
    """
    cfg = self.config
    length = tokens.shape[1]
    if length > cfg.max_len:
      raise ValueError(
          f'Input length {length} is longer than config.model.max_len='
          f'{cfg.max_len}; truncate or window the input to at most '
          f'{cfg.max_len} tokens, or raise max_len.'
      )
    x = self.token_embedding(tokens)
    x = x + self.position_embedding[None, :length].astype(x.dtype)
    if cfg.num_segments:
      if segments is None:
        segments = jnp.zeros_like(tokens)
      x = x + jnp.take(self.segment_embedding, segments, axis=0).astype(x.dtype)
    if not cfg.pre_layer_norm:
      x = self.embedding_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    shared = self.shared_projection() if hasattr(self, 'shared_projection') else (None, None)
    for layer in self.layers:
      x = layer(x, padding_mask, shared, deterministic)
    if cfg.pre_layer_norm:
      x = self.final_norm(x)
    return x

  def logits_from_embedding(self, hidden: Array) -> Array:
    """Output logits with the token embedding as the (tied) decoder."""
    return self.token_embedding.attend(hidden)


class MaskedLanguageModel(nn.Module):
  """The encoder with RoBERTa's MLM head; the decoder is the tied embedding."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens, padding_mask=None, *, deterministic=True, positions=None):
    """Returns float32 logits [batch, length, vocab_size].

    With `positions` ([batch, num_predictions] int), only the logits at those
    positions are computed, [batch, num_predictions, vocab_size]: training
    predicts ~15% of the tokens, and the vocabulary projection is the largest
    matrix multiply of a small model.
    """
    cfg = self.config
    dtype = cfg.compute_dtype
    encoder = Encoder(cfg, name='encoder')
    h = encoder(tokens, padding_mask, deterministic=deterministic)
    if positions is not None:
      h = jnp.take_along_axis(h, positions[:, :, None], axis=1)
    h = _dense(cfg.hidden_dim, (axes.EMBED,), (axes.EMBED_OUT,), name='mlm_dense', dtype=dtype)(h)
    h = _layer_norm('mlm_norm', dtype)(nn.gelu(h, approximate=False))
    logits = encoder.logits_from_embedding(h)
    bias = self.param(
        'mlm_bias',
        _partitioned(nn.initializers.zeros, (axes.VOCAB,)),
        (cfg.vocab_size,),
        jnp.float32,
    )
    return logits.astype(jnp.float32) + bias


def mean_pool(hidden: jax.Array, padding_mask: Optional[jax.Array]) -> jax.Array:
  """The mean of the real tokens' vectors: [batch, len, d] -> float32 [batch, d]."""
  weights = (
      jnp.ones(hidden.shape[:2], jnp.float32)
      if padding_mask is None
      else padding_mask.astype(jnp.float32)
  )
  return jnp.einsum('bl,bld->bd', weights, hidden.astype(jnp.float32)) / jnp.maximum(
      weights.sum(axis=1, keepdims=True), 1.0
  )


def attention_pool(
    hidden: jax.Array, padding_mask: Optional[jax.Array], query: jax.Array
) -> jax.Array:
  """One learned query attending over the real tokens: [batch, len, d] -> [batch, d].

  The weights are softmax(hidden . query / sqrt(d)) over the real tokens
  (padding gets none), in float32; a zero query weighs the tokens equally,
  which is mean pooling.
  """
  h = hidden.astype(jnp.float32)
  scores = jnp.einsum('bld,d->bl', h, query.astype(jnp.float32)) / math.sqrt(h.shape[-1])
  if padding_mask is not None:
    scores = jnp.where(padding_mask, scores, attention.MASKED_LOGIT)
  return jnp.einsum('bl,bld->bd', jax.nn.softmax(scores, axis=-1), h)


class SequenceClassifier(nn.Module):
  """The encoder with a classification head on a pooled vector.

  config.pooling='first' reads the first token (bos, as RoBERTa's <s>);
  'mean' averages the real tokens (the Long Range Arena's classifiers);
  'attention' weighs the real tokens by a learned query (`pool_query`,
  starting at zero: mean pooling).
  """

  config: ModelConfig
  num_classes: int

  @nn.compact
  def __call__(self, tokens, padding_mask=None, *, segments=None, deterministic=True):
    """Returns float32 logits [batch, num_classes]."""
    cfg = self.config
    dtype = cfg.compute_dtype
    h = Encoder(cfg, name='encoder')(
        tokens, padding_mask, segments=segments, deterministic=deterministic
    )
    if cfg.pooling == 'mean':
      h = mean_pool(h, padding_mask).astype(h.dtype)
    elif cfg.pooling == 'attention':
      query = self.param(
          'pool_query',
          _partitioned(nn.initializers.zeros, (axes.EMBED,)),
          (cfg.hidden_dim,),
          jnp.float32,
      )
      h = attention_pool(h, padding_mask, query).astype(h.dtype)
    else:
      h = h[:, 0]
    h = _dense(
        cfg.hidden_dim, (axes.EMBED,), (axes.EMBED_OUT,), name='classifier_dense', dtype=dtype
    )(h)
    h = nn.Dropout(cfg.dropout_rate)(jnp.tanh(h), deterministic=deterministic)
    logits = _dense(
        self.num_classes, (axes.EMBED_OUT,), (axes.CLASSES,), name='classifier_out', dtype=dtype
    )(h)
    return logits.astype(jnp.float32)


def count_projection_matrices(variables, config: ModelConfig) -> int:
  """Counts the distinct sequence-projection weights (E, F) in a model.

  A per-head weight with a leading heads axis counts once per head.
  """
  weight_ndim = 3 if config.projection == 'conv' else 2
  count = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(variables)):
    if getattr(path[-1], 'key', '') in PROJECTION_NAMES:
      count += math.prod(leaf.shape[:-weight_ndim])
  return count
