"""'performer': FAVOR+, softmax attention estimated by positive random features.

Choromanski et al. (2021), "Rethinking Attention with Performers": with
x' = x / d^(1/4) and m random directions w_1..w_m,

  phi(x) = exp(w_r . x' - |x'|^2 / 2)_r / sqrt(m),   E[phi(q) . phi(k)] = exp(q . k / sqrt(d)),

so attention is the linear transformer's feature attention with phi
(`linear_transformer.normalised_linear_attention`): O(n m d), no n x n matrix.
The w_r are orthogonal Gaussian blocks (`orthogonal_gaussian_features`): d
orthonormal directions per block, each scaled by the norm of a d-dimensional
Gaussian vector (chi with d degrees of freedom), as a Gaussian row has. m is
config.model.performer_features.

The directions are a `Constant` of each layer, one [m, head_dim] matrix its
heads share: drawn once from the run's seed when the model is initialised,
saved in checkpoints, never trained (the paper's periodic redrawing is left
out, so a restored run computes what it trained with).

Stability: exp overflows for large logits, so a shift is subtracted before it,
one the numerator and the denominator share, which cancels. A query's features
are shifted by their own largest exponent. Keys share one shift per row and
head: the largest exponent over the real keys (bidirectional) or, causal,
over the keys up to each position (a running maximum, carried with the prefix
sums as their scale; `linear_transformer.causal_chunk`), so that no key after
t changes anything at t. The shifts take no gradient: the output does not
depend on them.

Causal and decoding passes are the linear transformer's prefix sums with
these features; the decoding cache holds the sums and their scale.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model.attention_kinds import linear_transformer
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.attention_kinds.base import Constant
from linformer_jax.registry import Setting

Array = jax.Array


def orthogonal_gaussian_features(key: Array, shape, dtype=jnp.float32) -> Array:
  """Random feature directions [features, head_dim] (a Flax initializer).

  Rows come in blocks of head_dim mutually orthogonal unit directions, each
  block a uniformly random rotation; every row is then scaled by the norm of
  an independent Gaussian vector of head_dim entries, so that each row alone
  is distributed as a Gaussian row, and the blocks' orthogonality lowers the
  estimator's variance.
  """
  features, dim = shape
  blocks = -(-features // dim)
  direction_key, norm_key = jax.random.split(key)
  gaussian = jax.random.normal(direction_key, (blocks, dim, dim), jnp.float32)
  orthonormal, triangular = jnp.linalg.qr(gaussian)
  # QR fixes the signs of R's diagonal; undoing that makes each block a uniform
  # random rotation rather than one biased by the algorithm's convention.
  signs = jnp.sign(jnp.diagonal(triangular, axis1=-2, axis2=-1))
  directions = jnp.swapaxes(orthonormal * signs[:, None, :], 1, 2).reshape(blocks * dim, dim)
  norms = jnp.linalg.norm(jax.random.normal(norm_key, (features, dim), jnp.float32), axis=-1)
  return (directions[:features] * norms[:, None]).astype(dtype)


def feature_exponents(x: Array, random_features: Array) -> Array:
  """w_r . x' - |x'|^2 / 2 with x' = x / d^(1/4), the exponents of phi(x).

  Args:
    x: [batch, length, heads, head_dim] queries or keys.
    random_features: [features, head_dim], the w_r.

  Returns:
    float32 [batch, length, heads, features].
  """
  scaled = x.astype(jnp.float32) * x.shape[-1] ** -0.25
  projected = precision.einsum(
      'bnhd,md->bnhm', scaled.astype(x.dtype), random_features.astype(x.dtype)
  )
  return projected - 0.5 * jnp.sum(scaled * scaled, axis=-1, keepdims=True)


def query_features(q: Array, random_features: Array) -> Array:
  """phi(q) up to a factor per query (which cancels): float32 [batch, length,
  heads, features], the largest of each query's features 1 / sqrt(m)."""
  exponents = feature_exponents(q, random_features)
  shift = jax.lax.stop_gradient(jnp.max(exponents, axis=-1, keepdims=True))
  return jnp.exp(exponents - shift) / math.sqrt(random_features.shape[0])


def _real_exponents(k: Array, random_features: Array, key_padding_mask: Optional[Array]) -> Array:
  """The keys' exponents, MASKED_LOGIT for padded keys (whose features are
  then exp(MASKED_LOGIT) = 0: padding adds nothing and shifts nothing)."""
  exponents = feature_exponents(k, random_features)
  if key_padding_mask is None:
    return exponents
  return jnp.where(key_padding_mask[:, :, None, None], exponents, attention.MASKED_LOGIT)


def bidirectional_key_features(
    k: Array, random_features: Array, key_padding_mask: Optional[Array]
) -> Array:
  """phi(k) of the bidirectional pass, up to a factor every key of a row and
  head shares (which cancels): float32 [batch, length, heads, features], zero
  for padded keys."""
  exponents = _real_exponents(k, random_features, key_padding_mask)
  # [batch, 1, heads, 1]: the largest exponent of a row's real keys, for every key.
  shift = jax.lax.stop_gradient(jnp.max(exponents, axis=(1, 3), keepdims=True))
  return jnp.exp(exponents - shift) / math.sqrt(random_features.shape[0])


def performer_attention(
    q: Array,
    k: Array,
    v: Array,
    random_features: Array,
    key_padding_mask: Optional[Array] = None,
) -> Array:
  """Bidirectional FAVOR+ attention; see the module docstring.

  Args:
    q: [batch, q_length, heads, head_dim].
    k, v: [batch, kv_length, heads, head_dim].
    random_features: [features, head_dim], the w_r.
    key_padding_mask: optional [batch, kv_length], True for real keys.

  Returns:
    [batch, q_length, heads, head_dim] in the dtype of `q`.
  """
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  key_features, values = linear_transformer.without_padding(
      bidirectional_key_features(k, random_features, key_padding_mask), v, key_padding_mask
  )
  out = linear_transformer.normalised_linear_attention(
      query_features(q, random_features), key_features, values
  )
  return out.astype(q.dtype)


def causal_performer_attention(
    q: Array,
    k: Array,
    v: Array,
    random_features: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    chunk: int = linear_transformer.CAUSAL_CHUNK,
) -> Array:
  """Causal FAVOR+ attention of [batch, length, heads, head_dim] q, k, v:
  position t sees the real keys s <= t. Output in the dtype of q."""
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  exponents = _real_exponents(k, random_features, key_padding_mask)
  # The largest exponent of the keys up to each position: [batch, length, heads].
  running_max = jax.lax.stop_gradient(jax.lax.cummax(jnp.max(exponents, axis=-1), axis=1))
  key_features = jnp.exp(exponents - running_max[..., None]) / math.sqrt(random_features.shape[0])
  key_features, values = linear_transformer.without_padding(key_features, v, key_padding_mask)
  out = linear_transformer.causal_linear_attention(
      query_features(q, random_features), key_features, values, running_max, chunk=chunk
  )
  return out.astype(q.dtype)


@REGISTRY.register('performer')
class Performer(AttentionKind):
  """FAVOR+ attention with fixed orthogonal random features; see the module docstring."""

  uses_kernel = False  # its own feature attention, no softmax kernel
  drops_attention_weights = False  # no attention-weight matrix is formed

  settings = (
      Setting(
          'performer_features',
          int,
          256,
          minimum=1,
          allowed='use a positive integer (the number m of random features)',
          help_text='m, the random features per head',
      ),
  )

  def constants(self, config):
    shape = (config.setting('performer_features'), config.head_dim)
    return {'random_features': Constant(shape=shape, init=orthogonal_gaussian_features)}

  def attend(self, q, keys, values, key_mask, *, kernel):
    del kernel  # the kernels compute softmax attention, which this kind estimates
    return performer_attention(q, keys, values, self.constant_values['random_features'], key_mask)

  def attention_weights(self, q, keys, values, key_mask):
    features = self.constant_values['random_features']
    key_features, _ = linear_transformer.without_padding(
        bidirectional_key_features(keys, features, key_mask), values, key_mask
    )
    return linear_transformer.normalised_feature_weights(query_features(q, features), key_features)

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del projection, config
    features = self.constant_values['random_features']
    return causal_performer_attention(q, k, v, features, padding_mask)

  def init_cache(self, batch, config, projection, dtype):
    del projection, dtype  # the sums stay float32
    features = config.setting('performer_features')
    sums = linear_transformer.empty_sums(batch, config.num_heads, features, config.head_dim)
    return sums._asdict()

  def decode(self, cache, q, k, v, position, projection, config):
    del projection, config
    features = self.constant_values['random_features']
    exponents = feature_exponents(k, features)  # [batch, 1, heads, m]
    own_max = jnp.max(exponents, axis=-1)  # [batch, 1, heads]
    sums = linear_transformer.RunningSums(**cache)
    # The cache starts as zeros, which is no scale yet: the first key sets it.
    before = jnp.where(position == 0, own_max[:, 0], sums.scale)
    running_max = jnp.maximum(before, own_max[:, 0])[:, None]
    key_features = jnp.exp(exponents - running_max[..., None]) / math.sqrt(features.shape[0])
    sums, out = linear_transformer.causal_chunk(
        sums._replace(scale=before), query_features(q, features), key_features, v, running_max
    )
    return out.astype(q.dtype), sums._asdict()
