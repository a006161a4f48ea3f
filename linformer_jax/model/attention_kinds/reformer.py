"""'reformer': LSH attention, each query over the keys hashed near it.

Kitaev et al. (2020), "Reformer: The Efficient Transformer". Queries and keys
are shared: key j is query j normalised, k_j = q_j / |q_j|, so the layer's key
dense layer is never applied (`keys_and_values` passes the values in the keys'
place; a causal model's layer still computes its keys, which nothing reads).
Each of R hash rounds (config.model.reformer_n_hashes):

  1. hashes every position into one of B buckets by angular LSH,
     bucket = argmax [x W; -x W] for a random Gaussian W [head_dim, B / 2];
  2. sorts the positions by (bucket, position) and cuts the sorted order into
     chunks of c = ceil(n / B) positions (the paper's mean bucket size);
  3. lets each query attend to the keys of its chunk and of the chunk before
     (none before the first): [c, 2c] logits per chunk, O(n c) memory per
     head and round, never n x n.

B = max_len / reformer_bucket_size, rounded up to an even number (at least 2),
so that c <= reformer_bucket_size for any n <= max_len (equal when n = max_len
is a multiple of 2 * reformer_bucket_size).

A query never attends to itself unless no other key is open to it: its own
logit is lowered by SELF_PENALTY, finite, so a query with nothing else still
attends to itself. Padded keys are masked; padded positions go to a bucket of
their own, sorted after every real one, so the content of padding never moves
a real token's chunk and never reaches its output.

Rounds are combined by their log-sum-exp: out_i = sum_r exp(z_i^r - z_i) o_i^r,
with o_i^r the round's output, z_i^r the log-sum-exp of its logits and z_i that
of all rounds. A key open to query i in N_ij rounds has log N_ij subtracted in
each, so the result is the softmax over the union of the rounds' keys, each
key counted once (the paper's multi-round attention). Counting them takes
[c, 2c, R] comparisons per chunk and round: O(n c R^2) memory per head.

The W of the rounds are a `Constant` of each layer, [R, head_dim, B / 2], the
same for its heads: drawn once from the run's seed when the model is
initialised, saved in checkpoints, never trained. The paper draws them anew at
every pass; fixed ones make a restored run and every evaluation compute what
training computed, and, since no gradient flows through a bucket choice, the
model loses no signal by it.

Padding appended to a sequence may change its real outputs (they never change
with what padding holds): the chunk length c = ceil(n / B) follows the padded
length n, and a new c moves the chunk boundaries.

Causal (config.model.causal): query t attends to the keys of its own bucket at
positions before it that are among the c positions before it in the sorted
order (so within its chunk window), and to itself by the same rule as above.
The chunk window alone would not do: which earlier keys share a query's chunk
depends on how many later tokens hash into lower buckets, so a later token
would change an earlier output. Within one bucket the sorted order is the
position order, so these keys are the last c of its bucket before t, fixed by
the tokens up to t. There is no decoding pass.
"""

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model.attention_kinds.base import ATTENDED
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.attention_kinds.base import Constant
from linformer_jax.registry import Setting

Array = jax.Array

# Lowers a query's logit for itself: exp(-SELF_PENALTY) is 0 in float32 beside
# any other open key, and a query with none keeps all its weight on itself.
# Above every real logit, far below MASKED_LOGIT.
SELF_PENALTY = 1e5


def bucket_count(max_len: int, bucket_size: int) -> int:
  """B: max_len / bucket_size rounded up, then up to an even number, at least 2."""
  buckets = -(-max_len // bucket_size)
  return max(2, buckets + buckets % 2)


def chunk_length(length: int, buckets: int) -> int:
  """c = ceil(n / B), the positions of a chunk of the sorted order."""
  return -(-length // buckets)


def lsh_buckets(q: Array, rotations: Array, key_padding_mask: Optional[Array] = None) -> Array:
  """Each position's bucket in each hash round.

  Args:
    q: [batch, length, heads, head_dim], the shared queries and keys.
    rotations: [rounds, head_dim, B / 2], the W of each round.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    int32 [batch, heads, rounds, length]: argmax [q W; -q W], in [0, B); B for
    a padded position (a bucket after every real one).
  """
  # Full float32: a bucket is a comparison, and rounding would move ties.
  rotated = jnp.einsum(
      'bnhd,rdk->bhrnk',
      q.astype(jnp.float32),
      rotations.astype(jnp.float32),
      precision=jax.lax.Precision.HIGHEST,
  )
  buckets = jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)
  if key_padding_mask is None:
    return buckets
  return jnp.where(key_padding_mask[:, None, None, :], buckets, 2 * rotations.shape[-1])


def _chunked(x: Array, chunk: int, fill) -> Array:
  """[batch, heads, rounds, n, ...] -> [batch, heads, rounds, chunks, c, ...],
  the last chunk filled with `fill`."""
  length = x.shape[3]
  chunks = -(-length // chunk)
  widths = [(0, 0)] * x.ndim
  widths[3] = (0, chunks * chunk - length)
  x = jnp.pad(x, widths, constant_values=fill)
  return x.reshape(x.shape[:3] + (chunks, chunk) + x.shape[4:])


def _with_previous(x: Array, fill) -> Array:
  """Chunks [batch, heads, rounds, chunks, c, ...] -> windows [..., chunks, 2c, ...]:
  the chunk before (a chunk of `fill` before the first), then the chunk."""
  widths = [(0, 0)] * x.ndim
  widths[3] = (1, 0)
  previous = jnp.pad(x, widths, constant_values=fill)[:, :, :, :-1]
  return jnp.concatenate([previous, x], axis=4)


def _sorted(x: Array, order: Array) -> Array:
  """Per-position x [batch, heads, n, ...] in each round's sorted order
  (order [batch, heads, rounds, n]): [batch, heads, rounds, n, ...]."""
  index = order.reshape(order.shape + (1,) * (x.ndim - 3))
  return jnp.take_along_axis(x[:, :, None], index, axis=3)


def lsh_attention(
    q: Array,
    v: Array,
    rotations: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    causal: bool = False,
) -> Array:
  """Shared-QK LSH attention; see the module docstring.

  Args:
    q: [batch, length, heads, head_dim], the queries; the keys are these normalised.
    v: [batch, length, heads, head_dim].
    rotations: [rounds, head_dim, B / 2], the hashing W of each round.
    key_padding_mask: optional [batch, length], True for real tokens.
    causal: position t attends to keys at positions <= t only, by the rule
      of the module docstring.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  attention.check_qkv(q, q, v)
  attention.check_mask(key_padding_mask, q.shape[0], q.shape[1])
  batch, length, heads, head_dim = q.shape
  rounds, num_buckets = rotations.shape[0], 2 * rotations.shape[-1]
  chunk = chunk_length(length, num_buckets)
  real = jnp.ones((batch, length), bool) if key_padding_mask is None else key_padding_mask
  # Padded rows zeroed: whatever padding holds (NaN included) reaches nothing.
  q = jnp.where(real[:, :, None, None], q, jnp.zeros_like(q))
  v = jnp.where(real[:, :, None, None], v, jnp.zeros_like(v))

  bucket = lsh_buckets(q, rotations, real)  # [batch, heads, rounds, n]
  position = jnp.arange(length, dtype=jnp.int32)
  order = jnp.argsort(bucket * length + position, axis=-1)  # the position at each slot
  slot = jnp.argsort(order, axis=-1)  # each position's slot

  # [batch, n, heads, head_dim] -> the sorted order's chunks, [batch, heads, rounds,
  # chunks, c, head_dim].
  chunks = lambda x: _chunked(_sorted(jnp.swapaxes(x, 1, 2), order), chunk, 0)
  queries = chunks(q)
  keys = _with_previous(chunks(_unit_length(q).astype(q.dtype)), 0)
  values = _with_previous(chunks(v), 0)
  # Per slot, its position and bucket; a slot past the end has position -1 and
  # padding's bucket, so that it is no key.
  query_position = _chunked(order, chunk, -1)  # [batch, heads, rounds, chunks, c]
  key_position = _with_previous(query_position, -1)  # [batch, heads, rounds, chunks, 2c]
  query_bucket = _chunked(jnp.take_along_axis(bucket, order, axis=-1), chunk, num_buckets)
  key_bucket = _with_previous(query_bucket, num_buckets)

  open_keys = (key_bucket < num_buckets)[..., None, :]  # real keys: [..., c, 2c]
  if causal:
    # Query i of a chunk is slot c + i of its window, key s slot s: at most c back.
    within_reach = jnp.arange(2 * chunk)[None, :] >= jnp.arange(chunk)[:, None]
    open_keys = (
        open_keys
        & (key_position[..., None, :] <= query_position[..., :, None])
        & (key_bucket[..., None, :] == query_bucket[..., :, None])
        & within_reach
    )
  logits = precision.einsum('bhrkqd,bhrksd->bhrkqs', queries, keys) / math.sqrt(head_dim)
  itself = key_position[..., None, :] == query_position[..., :, None]
  logits = logits - SELF_PENALTY * itself
  if rounds > 1:
    logits = logits - jnp.log(_rounds_open(slot, bucket, order, chunk, causal))
  logits = jnp.where(open_keys, logits, attention.MASKED_LOGIT)
  log_sums = jax.nn.logsumexp(logits, axis=-1)  # [batch, heads, rounds, chunks, c]
  weights = jnp.exp(logits - log_sums[..., None])
  out = precision.einsum('bhrkqs,bhrksd->bhrkqd', weights.astype(v.dtype), values)

  # Back to position order, then the rounds weighted by their share of the total.
  by_slot = lambda x: x.reshape(x.shape[:3] + (-1,) + x.shape[5:])[:, :, :, :length]
  out = _sorted_back(by_slot(out), slot)  # [batch, heads, rounds, n, head_dim]
  log_sums = _sorted_back(by_slot(log_sums), slot)  # [batch, heads, rounds, n]
  round_weights = jax.nn.softmax(log_sums, axis=2)
  out = jnp.sum(round_weights[..., None] * out, axis=2)  # [batch, heads, n, head_dim]
  return jnp.swapaxes(out, 1, 2).astype(q.dtype)


def lsh_weights(q: Array, rotations: Array, key_padding_mask: Optional[Array] = None) -> Array:
  """The matrix bidirectional `lsh_attention` applies to the values, for analyses.

  The rounds' log-sum-exp merge is one softmax over the union of the keys
  open to a query in any round (those of its chunk and the chunk before, in
  that round's sorted order), each key once: that softmax, formed densely.
  A query with no open key gets a zero row, as its output is zero.

  Args:
    q: [batch, length, heads, head_dim], the queries; the keys are these normalised.
    rotations: [rounds, head_dim, B / 2], the hashing W of each round.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    float32 [batch, heads, length, length].
  """
  attention.check_mask(key_padding_mask, q.shape[0], q.shape[1])
  batch, length, _, head_dim = q.shape
  chunk = chunk_length(length, 2 * rotations.shape[-1])
  real = jnp.ones((batch, length), bool) if key_padding_mask is None else key_padding_mask
  q = jnp.where(real[:, :, None, None], q, jnp.zeros_like(q))
  bucket = lsh_buckets(q, rotations, real)  # [batch, heads, rounds, n]
  position = jnp.arange(length, dtype=jnp.int32)
  slot = jnp.argsort(jnp.argsort(bucket * length + position, axis=-1), axis=-1)
  chunk_of = slot // chunk
  back = chunk_of[..., :, None] - chunk_of[..., None, :]  # [batch, heads, rounds, query, key]
  open_keys = jnp.any((back == 0) | (back == 1), axis=2) & real[:, None, None, :]
  keys = _unit_length(q).astype(q.dtype)
  logits = precision.einsum('bnhd,bshd->bhns', q, keys) / math.sqrt(head_dim)
  logits = logits - SELF_PENALTY * jnp.eye(length, dtype=logits.dtype)
  weights = jax.nn.softmax(jnp.where(open_keys, logits, attention.MASKED_LOGIT), axis=-1)
  return jnp.where(jnp.any(open_keys, axis=-1, keepdims=True), weights, 0.0)


def _unit_length(x: Array) -> Array:
  """x / |x| over the last axis, float32 (a zero row stays zero)."""
  x = x.astype(jnp.float32)
  squared_norm = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(squared_norm, 1e-12))


def _sorted_back(x: Array, slot: Array) -> Array:
  """x [batch, heads, rounds, n, ...] in sorted order, back in position order."""
  index = slot.reshape(slot.shape + (1,) * (x.ndim - 4))
  return jnp.take_along_axis(x, index, axis=3)


def _rounds_open(slot: Array, bucket: Array, order: Array, chunk: int, causal: bool) -> Array:
  """N_ij: in how many rounds key j is open to query i, for each (query, key)
  pair of each round's windows (1 for a pair open in that round alone).

  Args:
    slot, bucket: int [batch, heads, rounds, n], each position's slot and
      bucket in each round.
    order: int [batch, heads, rounds, n], the position at each slot.
    chunk: c.
    causal: the causal rule (own bucket, at most c slots back) instead of the
      chunk window.

  Returns:
    float32 [batch, heads, rounds, chunks, c, 2c], at least 1.
  """
  # Per position, every round's slot and bucket: [batch, heads, n, rounds'];
  # then in each round's sorted order, chunked: [batch, heads, rounds, chunks, c, rounds'].
  per_position = lambda x: jnp.moveaxis(x, 2, 3)
  query_slot = _chunked(_sorted(per_position(slot), order), chunk, -1)
  key_slot = _with_previous(query_slot, -1)[..., None, :, :]
  query_slot = query_slot[..., :, None, :]
  if causal:
    query_bucket = _chunked(_sorted(per_position(bucket), order), chunk, -1)
    key_bucket = _with_previous(query_bucket, -1)[..., None, :, :]
    back = query_slot - key_slot
    open_in = (key_bucket == query_bucket[..., :, None, :]) & (back >= 0) & (back <= chunk)
  else:
    back = query_slot // chunk - key_slot // chunk
    open_in = (back == 0) | (back == 1)
  return jnp.maximum(jnp.sum(open_in, axis=-1, dtype=jnp.float32), 1.0)


@REGISTRY.register('reformer')
class Reformer(AttentionKind):
  """Shared-QK LSH attention with fixed random rotations; see the module docstring."""

  uses_kernel = False  # its own chunked softmax, no kernel's
  drops_attention_weights = False  # its chunked softmax has no dropout
  queries_independent = False  # the sorted order mixes every position's bucket

  settings = (
      Setting(
          'reformer_n_hashes',
          int,
          2,
          minimum=1,
          allowed='use a positive integer (the number of hash rounds)',
          help_text='hash rounds, combined by log-sum-exp',
      ),
      Setting(
          'reformer_bucket_size',
          int,
          64,
          minimum=1,
          allowed='use a positive integer (the mean bucket size; buckets = max_len / it)',
          help_text='mean bucket size; buckets = max_len / it',
      ),
  )

  def constants(self, config):
    buckets = bucket_count(config.max_len, config.setting('reformer_bucket_size'))
    shape = (config.setting('reformer_n_hashes'), config.head_dim, buckets // 2)
    return {'rotations': Constant(shape=shape, init=nn.initializers.normal(stddev=1.0))}

  def keys_and_values(self, x, padding_mask, dense, projection, config, *, compress_first, record):
    del projection, config, compress_first
    # Shared QK: the keys are the queries, which `attend` receives; the values
    # stand in the keys' place, and the key dense layer is never applied.
    values = dense.values(x)
    record(ATTENDED, (values, values, padding_mask))
    return values, values, padding_mask

  def attend(self, q, keys, values, key_mask, *, kernel):
    del keys, kernel  # the keys are the normalised queries; no kernel computes this
    return lsh_attention(q, values, self.constant_values['rotations'], key_mask)

  def attention_weights(self, q, keys, values, key_mask):
    del keys, values  # the keys are the normalised queries; P does not depend on the values
    return lsh_weights(q, self.constant_values['rotations'], key_mask)

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del k, projection, config  # shared QK: the keys are the normalised queries
    return lsh_attention(q, v, self.constant_values['rotations'], padding_mask, causal=True)
