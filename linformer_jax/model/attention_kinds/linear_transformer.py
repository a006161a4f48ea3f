"""'linear_transformer': attention through a positive feature map, linear in n.

Katharopoulos et al. (2020), "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention": the softmax's exp(q . k) becomes
phi(q) . phi(k), with phi(x) = elu(x) + 1 > 0, so that

  out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j)),

and the two sums over keys are made once for every query: O(n d^2) time and
no n x n matrix. Padded keys are left out of both sums.

Causal (config.model.causal): query t's sums run over s <= t only. They are
prefix sums, taken CAUSAL_CHUNK positions at a time (`causal_linear_attention`):
within a chunk the masked c x c products, and the sums of the chunks before it,
carried by a scan; memory O(c^2 + d^2) per head and step, never n x n.
Decoding keeps the running sums in the cache (variables 'state', 'normaliser'
and 'scale', float32) and costs O(d^2) a token at any position.

The feature-map attention here (`normalised_linear_attention`,
`causal_linear_attention`, `causal_chunk`) takes any non-negative features;
the Performer (performer.py) uses it with its positive random features, whose
exponentials need the key scales that `causal_chunk` carries.
"""

from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind

Array = jax.Array

# Positions per step of the causal scan. A step holds a c x c score matrix
# per head, and the backward pass keeps the running sums ([features, head_dim]
# per head) of each of the n / c steps: a larger c trades the second for the
# first.
CAUSAL_CHUNK = 64


class RunningSums(NamedTuple):
  """The sums over the keys so far, carried from chunk to chunk (a causal
  pass) or from token to token (the decoding cache); all float32.

  Attributes:
    state: [batch, heads, features, head_dim], sum_s phi(k_s) v_s^T.
    normaliser: [batch, heads, features], sum_s phi(k_s).
    scale: [batch, heads], the log scale both sums are relative to: they hold
      the sums times exp(-scale), so that exponential features never overflow
      (always 0 for the linear transformer's features).
  """

  state: Array
  normaliser: Array
  scale: Array


def empty_sums(batch: int, heads: int, features: int, head_dim: int) -> RunningSums:
  """The sums before the first key: zeros."""
  return RunningSums(
      state=jnp.zeros((batch, heads, features, head_dim), jnp.float32),
      normaliser=jnp.zeros((batch, heads, features), jnp.float32),
      scale=jnp.zeros((batch, heads), jnp.float32),
  )


def elu_features(x: Array) -> Array:
  """phi(x) = elu(x) + 1, positive, float32, of the same shape as x."""
  return jax.nn.elu(x.astype(jnp.float32)) + 1.0


def without_padding(
    key_features: Array, values: Array, key_padding_mask: Optional[Array]
) -> Tuple[Array, Array]:
  """Zeroes the features and values of padded keys, so that they add nothing
  to any sum (whatever the padding holds, NaN included)."""
  if key_padding_mask is None:
    return key_features, values
  real = key_padding_mask[:, :, None, None]
  return (
      jnp.where(real, key_features, 0.0),
      jnp.where(real, values, jnp.zeros_like(values)),
  )


def _ratio(numerator: Array, denominator: Array) -> Array:
  """numerator [..., head_dim] / denominator [...]; 0 for a query that sees no
  key (a denominator of 0), instead of NaN."""
  seen = denominator > 0
  return numerator / jnp.where(seen, denominator, 1.0)[..., None]


def normalised_linear_attention(query_features: Array, key_features: Array, values: Array) -> Array:
  """Every query over every key through non-negative features.

  out_i = sum_j (f_i . g_j) v_j / sum_j (f_i . g_j), for query features f and
  key features g; the products take the values' dtype, the normaliser is
  float32.

  Args:
    query_features: float32 [batch, q_length, heads, features].
    key_features: float32 [batch, kv_length, heads, features], zero for keys
      that must not be attended to.
    values: [batch, kv_length, heads, head_dim].

  Returns:
    float32 [batch, q_length, heads, head_dim].
  """
  dtype = values.dtype
  key_value_sums = precision.einsum('bkhm,bkhd->bhmd', key_features.astype(dtype), values)
  numerator = precision.einsum(
      'bqhm,bhmd->bqhd', query_features.astype(dtype), key_value_sums.astype(dtype)
  )
  key_sums = jnp.sum(key_features, axis=1)  # [batch, heads, features]
  denominator = jnp.sum(query_features * key_sums[:, None], axis=-1)
  return _ratio(numerator, denominator)


def normalised_feature_weights(query_features: Array, key_features: Array) -> Array:
  """The matrix `normalised_linear_attention` applies to the values, for analyses.

  P[b, h, i, j] = f_i . g_j / sum_j' f_i . g_j' for the same non-negative
  features (keys that must not be attended to zero); a query that sees no key
  gets a zero row, as its output is zero.

  Returns:
    float32 [batch, heads, q_length, kv_length].
  """
  scores = jnp.einsum(
      'bqhm,bkhm->bhqk', query_features, key_features, precision=jax.lax.Precision.HIGHEST
  )
  total = jnp.sum(scores, axis=-1, keepdims=True)
  return scores / jnp.where(total > 0, total, 1.0)


def causal_chunk(
    sums: RunningSums,
    query_features: Array,
    key_features: Array,
    values: Array,
    key_log_scale: Array,
) -> Tuple[RunningSums, Array]:
  """Causal feature attention of c positions that follow those `sums` holds.

  Query t of the chunk sees the keys of `sums` and the chunk's keys s <= t.
  The true feature of key s is key_features[s] * exp(key_log_scale[s]); query
  t's sums are taken relative to exp(key_log_scale[t]), a factor its
  numerator and denominator share, and as the scale never decreases every
  factor exp(scale_s - scale_t) below is at most 1.

  Args:
    sums: the running sums of the positions before the chunk, relative to a
      scale no larger than key_log_scale[:, 0].
    query_features, key_features: float32 [batch, c, heads, features].
    values: [batch, c, heads, head_dim].
    key_log_scale: float32 [batch, c, heads], non-decreasing along c.

  Returns:
    the sums up to the chunk's last position (relative to its scale), and the
    float32 output [batch, c, heads, head_dim].
  """
  dtype = values.dtype
  chunk = values.shape[1]
  scale_by_head = jnp.swapaxes(key_log_scale, 1, 2)  # [batch, heads, c]
  # [batch, heads, t, s]: exp(scale_s - scale_t); clipped at 0 where s > t,
  # which the mask drops, so that no exponential (or its gradient) overflows.
  relative = jnp.exp(jnp.minimum(scale_by_head[:, :, None, :] - scale_by_head[:, :, :, None], 0.0))
  seen = jnp.tril(jnp.ones((chunk, chunk), bool))
  scores = precision.einsum(
      'bthm,bshm->bhts', query_features.astype(dtype), key_features.astype(dtype)
  )
  weights = jnp.where(seen, scores * relative, 0.0)
  carried = jnp.exp(sums.scale[:, None, :] - key_log_scale)  # [batch, c, heads]
  numerator = precision.einsum('bhts,bshd->bthd', weights.astype(dtype), values)
  numerator += (
      precision.einsum('bthm,bhmd->bthd', query_features.astype(dtype), sums.state.astype(dtype))
      * carried[..., None]
  )
  denominator = jnp.swapaxes(jnp.sum(weights, axis=-1), 1, 2)
  denominator += jnp.sum(query_features * sums.normaliser[:, None], axis=-1) * carried
  out = _ratio(numerator, denominator)

  last = key_log_scale[:, -1]  # [batch, heads]
  to_last = key_features * jnp.exp(key_log_scale - last[:, None])[..., None]
  rescale = jnp.exp(sums.scale - last)
  new_sums = RunningSums(
      state=sums.state * rescale[..., None, None]
      + precision.einsum('bshm,bshd->bhmd', to_last.astype(dtype), values),
      normaliser=sums.normaliser * rescale[..., None] + jnp.sum(to_last, axis=1),
      scale=last,
  )
  return new_sums, out


def causal_linear_attention(
    query_features: Array,
    key_features: Array,
    values: Array,
    key_log_scale: Optional[Array] = None,
    *,
    chunk: int = CAUSAL_CHUNK,
) -> Array:
  """Left-to-right feature attention: query t over keys s <= t.

  out_t = sum_{s<=t} (f_t . g_s) v_s / sum_{s<=t} (f_t . g_s), by prefix sums
  a chunk at a time (`causal_chunk` under a scan), never an n x n matrix.

  Args:
    query_features, key_features: float32 [batch, length, heads, features],
      key features zero for padded keys.
    values: [batch, length, heads, head_dim].
    key_log_scale: float32 [batch, length, heads], non-decreasing along the
      length: the true key features are key_features * exp(key_log_scale).
      None: all 0.
    chunk: positions per step of the scan (the last step is padded).

  Returns:
    float32 [batch, length, heads, head_dim].
  """
  batch, length, heads, features = key_features.shape
  if key_log_scale is None:
    key_log_scale = jnp.zeros((batch, length, heads), jnp.float32)
  chunk = min(chunk, length)
  steps = -(-length // chunk)
  extra = steps * chunk - length
  # Positions past the end: keys with no features add nothing; the scale is
  # the last one repeated, as it must not decrease.
  pad = lambda x: jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))
  inputs = (
      pad(query_features),
      pad(key_features),
      pad(values),
      jnp.pad(key_log_scale, [(0, 0), (0, extra), (0, 0)], mode='edge'),
  )
  by_step = lambda x: jnp.moveaxis(x.reshape(batch, steps, chunk, *x.shape[2:]), 1, 0)
  start = empty_sums(batch, heads, features, values.shape[-1])._replace(scale=key_log_scale[:, 0])
  _, out = jax.lax.scan(
      lambda sums, step_inputs: causal_chunk(sums, *step_inputs),
      start,
      tuple(by_step(x) for x in inputs),
  )
  return jnp.moveaxis(out, 0, 1).reshape(batch, steps * chunk, heads, -1)[:, :length]


def linear_transformer_attention(
    q: Array, k: Array, v: Array, key_padding_mask: Optional[Array] = None
) -> Array:
  """Bidirectional linear-transformer attention; see the module docstring.

  Args:
    q: [batch, q_length, heads, head_dim].
    k, v: [batch, kv_length, heads, head_dim].
    key_padding_mask: optional [batch, kv_length], True for real keys.

  Returns:
    [batch, q_length, heads, head_dim] in the dtype of `q`.
  """
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  key_features, values = without_padding(elu_features(k), v, key_padding_mask)
  return normalised_linear_attention(elu_features(q), key_features, values).astype(q.dtype)


def causal_linear_transformer_attention(
    q: Array,
    k: Array,
    v: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    chunk: int = CAUSAL_CHUNK,
) -> Array:
  """Causal linear-transformer attention of [batch, length, heads, head_dim]
  q, k, v: position t sees the real keys s <= t. Output in the dtype of q."""
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  key_features, values = without_padding(elu_features(k), v, key_padding_mask)
  out = causal_linear_attention(elu_features(q), key_features, values, chunk=chunk)
  return out.astype(q.dtype)


@REGISTRY.register('linear_transformer')
class LinearTransformer(AttentionKind):
  """Attention through phi(x) = elu(x) + 1; see the module docstring."""

  uses_kernel = False  # its own feature attention, no softmax kernel
  drops_attention_weights = False  # no attention-weight matrix is formed

  def attend(self, q, keys, values, key_mask, *, kernel):
    del kernel  # the kernels compute softmax attention, which this kind replaces
    return linear_transformer_attention(q, keys, values, key_mask)

  def attention_weights(self, q, keys, values, key_mask):
    key_features, _ = without_padding(elu_features(keys), values, key_mask)
    return normalised_feature_weights(elu_features(q), key_features)

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del projection, config
    return causal_linear_transformer_attention(q, k, v, padding_mask)

  def init_cache(self, batch, config, projection, dtype):
    del projection, dtype  # the sums stay float32
    return empty_sums(batch, config.num_heads, config.head_dim, config.head_dim)._asdict()

  def decode(self, cache, q, k, v, position, projection, config):
    del position, projection, config
    no_scale = jnp.zeros(k.shape[:3], jnp.float32)  # [batch, 1, heads]
    sums, out = causal_chunk(RunningSums(**cache), elu_features(q), elu_features(k), v, no_scale)
    return out.astype(q.dtype), sums._asdict()
