"""Flax models: the RoBERTa-style encoder and its heads (masked LM, classifier,
causal LM), with full or Linformer attention.

The modules only hold parameters; the layers (`layers.py`) call the attention
kind and the sequence projection the config names (`attention_kinds`,
`projections`). One `ModelConfig` selects everything an ablation changes:
`attention` ('full' is the Transformer baseline, same code otherwise), `causal`
(left-to-right attention, for language modelling), the projected length k (one
or per layer), the parameter sharing mode and the sequence projection.

Parameters stay float32; `dtype='bfloat16'` only changes the compute dtype.
Every parameter carries logical axis names (see `logical_axes.py`) for sharding.
"""

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import logical_axes as axes
from linformer_jax.model.layers import CACHE
from linformer_jax.model.layers import DENSE_INIT
from linformer_jax.model.layers import PROJECTION_NAMES
from linformer_jax.model.layers import SCANNED_LAYERS
from linformer_jax.model.layers import SequenceProjection
from linformer_jax.model.layers import dense
from linformer_jax.model.layers import encoder_layer_class
from linformer_jax.model.layers import layer_norm
from linformer_jax.model.layers import partitioned
from linformer_jax.model.layers import scanned_layers
from linformer_jax.model.model_config import ModelConfig

Array = jax.Array


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
        embedding_init=partitioned(DENSE_INIT, (axes.VOCAB, axes.EMBED)),
    )
    self.position_embedding = self.param(
        'position_embedding',
        partitioned(DENSE_INIT, (axes.LENGTH, axes.EMBED)),
        (cfg.max_len, cfg.hidden_dim),
        jnp.float32,
    )
    if cfg.num_segments:
      # Zeros: a pretrained encoder without segments starts out unchanged.
      self.segment_embedding = self.param(
          'segment_embedding',
          partitioned(nn.initializers.zeros, (axes.SEGMENTS, axes.EMBED)),
          (cfg.num_segments, cfg.hidden_dim),
          jnp.float32,
      )
    self.embedding_norm = layer_norm('embedding_norm', cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if cfg.attention_kind.uses_projection and cfg.sharing == 'layerwise':
      self.shared_projection = SequenceProjection(
          cfg, cfg.projected_len_for_layer(0), per_head=False, share_key_value=True
      )
    if cfg.scan_layers:
      self.layer_stack = scanned_layers(cfg, name=SCANNED_LAYERS)
    else:
      layer_class = encoder_layer_class(cfg)
      self.layers = [layer_class(cfg, i) for i in range(cfg.num_layers)]
    if cfg.pre_layer_norm:
      self.final_norm = layer_norm('final_norm', cfg)

  def __call__(
      self,
      tokens: Array,
      padding_mask: Optional[Array] = None,
      *,
      segments: Optional[Array] = None,
      deterministic: bool = True,
      decode_position: Optional[Array] = None,
  ) -> Array:
    """Encodes tokens [batch, length] into [batch, length, hidden_dim].

    Args:
      tokens: int token ids, length at most max_len.
      padding_mask: optional [batch, length] boolean, True for real tokens.
      segments: optional [batch, length] int segment ids (0 = first sentence);
        used when config.num_segments > 1 (all 0 when not given), ignored
        otherwise (RoBERTa tells sentences apart by the separator alone; its
        one token-type embedding, num_segments=1, is added to every token).
      deterministic: disables dropout (evaluation).
      decode_position: decoding (causal models only): tokens is [batch, 1],
        the token at this int32 position (shared by the batch), and the
        layers read and update the 'cache' collection.
    """
    cfg = self.config
    length = tokens.shape[1]
    if length > cfg.max_len:
      raise ValueError(
          f'Input length {length} is longer than config.model.max_len='
          f'{cfg.max_len}; truncate or window the input to at most '
          f'{cfg.max_len} tokens, or raise max_len.'
      )
    x = self.embed_tokens(tokens)
    if decode_position is None:
      positions = self.position_embedding[None, :length]
    else:
      positions = jax.lax.dynamic_slice_in_dim(self.position_embedding, decode_position, 1)[None]
    x = x + positions.astype(x.dtype)
    if cfg.num_segments == 1:  # RoBERTa's one token type: the same row for every token
      x = x + self.segment_embedding[0].astype(x.dtype)
    elif cfg.num_segments:
      if segments is None:
        segments = jnp.zeros_like(tokens)
      x = x + jnp.take(self.segment_embedding, segments, axis=0).astype(x.dtype)
    if not cfg.pre_layer_norm:
      x = self.embedding_norm(x)
    x = self.dropout(x, deterministic=deterministic)
    shared = self.shared_projection() if hasattr(self, 'shared_projection') else (None, None)
    if cfg.scan_layers:
      x, _ = self.layer_stack(x, padding_mask, shared, deterministic, decode_position)
    else:
      for layer in self.layers:
        x = layer(x, padding_mask, shared, deterministic, decode_position)
    if cfg.pre_layer_norm:
      x = self.final_norm(x)
    return x

  def embed_tokens(self, tokens: Array) -> Array:
    """The tokens' rows of the float32 table, cast to the compute dtype.

    `nn.Embed` casts the table first, so under model.dtype='bfloat16' its
    gradient is a scatter-add into a bfloat16 table: the thousands of terms of a
    frequent token's row (the mask token is ~12% of a batch) add in bfloat16
    (`tests/test_matmul_dtypes.py` checks them against a float64 sum; what the
    scatter cost a step is in docs/benchmarks.md). Gathered from the float32
    table, the gradient adds in float32; the forward values are the same.
    """
    table = self.token_embedding.embedding
    return jnp.take(table, tokens, axis=0).astype(self.config.compute_dtype)

  def logits_from_embedding(self, hidden: Array) -> Array:
    """Output logits with the token embedding as the (tied) decoder."""
    return self.token_embedding.attend(hidden)


class MaskedLanguageModel(nn.Module):
  """The encoder with RoBERTa's MLM head; the decoder is the tied embedding."""

  config: ModelConfig

  @nn.compact
  def __call__(
      self, tokens, padding_mask=None, *, deterministic=True, positions=None, segments=None
  ):
    """Returns float32 logits [batch, length, vocab_size].

    With `positions` ([batch, num_predictions] int), only the logits at those
    positions are computed, [batch, num_predictions, vocab_size]: training
    predicts ~15% of the tokens, and the vocabulary projection is the largest
    matrix multiply of a small model. `segments` are passed to the encoder
    (token types of a checkpoint trained with them; all 0 when None).
    """
    cfg = self.config
    dtype = cfg.compute_dtype
    encoder = Encoder(cfg, name='encoder')
    h = encoder(tokens, padding_mask, segments=segments, deterministic=deterministic)
    if positions is not None:
      h = jnp.take_along_axis(h, positions[:, :, None], axis=1)
    h = dense(cfg.hidden_dim, (axes.EMBED,), (axes.EMBED_OUT,), name='mlm_dense', dtype=dtype)(h)
    h = layer_norm('mlm_norm', cfg)(nn.gelu(h, approximate=False))
    logits = encoder.logits_from_embedding(h)
    bias = self.param(
        'mlm_bias',
        partitioned(nn.initializers.zeros, (axes.VOCAB,)),
        (cfg.vocab_size,),
        jnp.float32,
    )
    return logits.astype(jnp.float32) + bias


class CausalLanguageModel(nn.Module):
  """A left-to-right language model: the encoder with config.causal=True and
  the tied embedding as its output layer (plus a bias)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens, padding_mask=None, *, deterministic=True, decode=False):
    """Returns float32 next-token logits [batch, length, vocab_size].

    With `decode`, tokens is [batch, 1], the next token of every sequence, and
    the position and attention state live in the 'cache' collection: call
    `init(..., decode=True)` for an empty cache, then apply with
    `mutable=['cache']` once per token.
    """
    cfg = self.config
    if not cfg.causal:
      raise ValueError('A causal language model needs config.model.causal=True.')
    position = None
    if decode:
      if tokens.shape[1] != 1:
        raise ValueError(f'Decoding reads one token per call; got tokens of shape {tokens.shape}.')
      index = self.variable(CACHE, 'position', lambda: jnp.zeros((), jnp.int32))
      position = index.value
      if not self.is_initializing():
        index.value = position + 1
    encoder = Encoder(cfg, name='encoder')
    h = encoder(tokens, padding_mask, deterministic=deterministic, decode_position=position)
    bias = self.param(
        'lm_bias',
        partitioned(nn.initializers.zeros, (axes.VOCAB,)),
        (cfg.vocab_size,),
        jnp.float32,
    )
    return encoder.logits_from_embedding(h).astype(jnp.float32) + bias


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
          partitioned(nn.initializers.zeros, (axes.EMBED,)),
          (cfg.hidden_dim,),
          jnp.float32,
      )
      h = attention_pool(h, padding_mask, query).astype(h.dtype)
    else:
      h = h[:, 0]
    h = dense(
        cfg.hidden_dim, (axes.EMBED,), (axes.EMBED_OUT,), name='classifier_dense', dtype=dtype
    )(h)
    h = nn.Dropout(cfg.dropout_rate)(jnp.tanh(h), deterministic=deterministic)
    logits = dense(
        self.num_classes, (axes.EMBED_OUT,), (axes.CLASSES,), name='classifier_out', dtype=dtype
    )(h)
    return logits.astype(jnp.float32)


def count_projection_matrices(variables, config: ModelConfig) -> int:
  """Counts the distinct sequence-projection weights (E, F) in a model.

  A per-head weight with a leading heads axis counts once per head.
  """
  weight_ndim = config.projection_kind.weight_ndim
  count = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(variables)):
    if getattr(path[-1], 'key', '') in PROJECTION_NAMES:
      count += math.prod(leaf.shape[:-weight_ndim])
  return count
