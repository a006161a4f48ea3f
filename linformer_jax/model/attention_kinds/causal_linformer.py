"""Causal Linformer by segment-wise compression, as pure functions of arrays.

A Linformer projection mixes every position into every compressed one, so it
cannot serve left-to-right language modelling as is. Here the sequence is cut
into blocks of `block` tokens (b), each compressed on its own into `slots`
summaries (r). A query at position t, in block j = t // b, attends with one
softmax over (a) the keys of its own block at positions s <= t, exactly, and
(b) the r summaries of each earlier block 0 .. j-1; nothing it sees depends on
a later position. Attention costs O(n * (b + (n / b) * r)) for n tokens.

The compressions are the sequence projections' own causal forms
(`SequenceProjectionKind.block_summaries`): a matrix [max_len, r] used
block-diagonally (rows i*b .. (i+1)*b - 1 map block i into its r slots), or
pooling and strided convolutions with window = stride = b // r, so windows
never cross blocks. Padded tokens never enter a summary, and a slot holding no
real token (a pooled window or a block of padding only) is masked out of the
softmax. `projection` arguments take a registered name ('linear', 'random',
'mean', 'max', 'conv', or one of your own) or a kind.

Shapes follow attention.py: q, k, v are [batch, length, heads, head_dim] and
key_padding_mask is [batch, length], True for real tokens. Softmax and
reductions run in float32; outputs come back in q's dtype.
"""

from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model import projections
from linformer_jax.model.projections import SequenceProjectionKind

Array = jax.Array


def _check_blocks(
    projection: SequenceProjectionKind, weight: Optional[Array], block: int, slots: int
) -> None:
  """Raises a ValueError naming what to change in a bad block configuration."""
  if block < 1:
    raise ValueError(f'block={block} must be at least 1 token.')
  if not 1 <= slots <= block:
    raise ValueError(f'slots={slots} must be between 1 and block={block}.')
  projection.check_blocks(weight, block, slots)


def _pad_to_blocks(x: Array, mask: Optional[Array], block: int) -> Tuple[Array, Array]:
  """Pads x [batch, length, ...] and its mask (False) to a multiple of block."""
  batch, length = x.shape[:2]
  if mask is None:
    mask = jnp.ones((batch, length), dtype=bool)
  pad = -length % block
  x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
  return x, jnp.pad(mask, ((0, 0), (0, pad)), constant_values=False)


def block_summaries(
    x: Array,
    projection: Any,
    weight: Optional[Array],
    *,
    block: int,
    slots: int,
    key_padding_mask: Optional[Array] = None,
    name: str = 'E',
) -> Tuple[Array, Array]:
  """Compresses each block of `block` positions of x into `slots` summaries.

  Args:
    x: [batch, length, heads, head_dim]; a length that is not a multiple of
      block is padded (as padding) to the next multiple.
    projection: a registered projection name or kind.
    weight: the projection's weight: [max_len, slots] or [heads, max_len,
      slots] for a matrix (row p maps position p into the slots of its own
      block; length must be at most max_len); a conv kernel [block // slots,
      head_dim, head_dim] or [heads, block // slots, head_dim, head_dim]; None
      for pooling.
    block: the block size b.
    slots: the summaries per block r.
    key_padding_mask: optional [batch, length], True for real tokens.
    name: the weight's name, used in error messages.

  Returns:
    summaries [batch, num_blocks * slots, heads, head_dim] in x's dtype, slot
    s summarising block s // slots, and their [batch, num_blocks * slots] mask,
    False for slots that hold no real token.
  """
  projection = projections.kind(projection)
  _check_blocks(projection, weight, block, slots)
  x, mask = _pad_to_blocks(x, key_padding_mask, block)
  return projection.block_summaries(
      x, weight, block=block, slots=slots, key_padding_mask=mask, name=name
  )


def _attend_block_and_summaries(
    q: Array,
    block_k: Array,
    block_v: Array,
    block_mask: Array,
    summary_k: Array,
    summary_v: Array,
    summary_mask: Array,
    head_major: bool = False,
    dropout: Optional[attention.WeightDropout] = None,
) -> Array:
  """One softmax over a block's own keys and the summaries of other blocks.

  Args:
    q: [batch, q_length, heads, head_dim].
    block_k, block_v: [batch, block, heads, head_dim], keys/values of the block.
    block_mask: [batch, q_length, block], True where a query may see a key.
    summary_k, summary_v: [batch, num_slots, heads, head_dim].
    summary_mask: [batch, num_slots], True for summaries every query may see.
    head_major: the summaries come as a decoding cache keeps them, summary_k
      [batch, heads, head_dim, num_slots] and summary_v [batch, heads,
      num_slots, head_dim] (see DecodeCache).
    dropout: dropout on the attention weights (training), or None.

  Returns:
    [batch, q_length, heads, head_dim] in float32.
  """
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
  block_logits = precision.einsum('bqhd,bkhd->bhqk', q, block_k.astype(q.dtype)) * scale
  key_spec, value_spec = ('bhds', 'bhsd') if head_major else ('bshd', 'bshd')
  summary_logits = precision.einsum(f'bqhd,{key_spec}->bhqs', q, summary_k.astype(q.dtype)) * scale
  block_logits = jnp.where(block_mask[:, None], block_logits, attention.MASKED_LOGIT)
  summary_logits = jnp.where(summary_mask[:, None, None], summary_logits, attention.MASKED_LOGIT)
  weights = jax.nn.softmax(jnp.concatenate([block_logits, summary_logits], axis=-1), axis=-1)
  weights = attention.drop_weights(weights, dropout)
  # A row with no visible key (a padded query) spreads uniformly over all keys,
  # later ones included; zeroing the masked weights keeps every row causal.
  block_len = block_k.shape[1]
  block_weights = jnp.where(block_mask[:, None], weights[..., :block_len], 0.0)
  summary_weights = jnp.where(summary_mask[:, None, None], weights[..., block_len:], 0.0)
  dtype = block_v.dtype
  out = precision.einsum('bhqk,bkhd->bqhd', block_weights.astype(dtype), block_v)
  return out + precision.einsum(
      f'bhqs,{value_spec}->bqhd', summary_weights.astype(dtype), summary_v.astype(dtype)
  )


def causal_block_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    block: int,
    slots: int,
    projection: Any,
    key_weight: Optional[Array],
    value_weight: Optional[Array],
    key_padding_mask: Optional[Array] = None,
    query_blocks_per_step: Optional[int] = None,
    dropout: Optional[attention.WeightDropout] = None,
) -> Array:
  """Causal Linformer attention: exact within a block, compressed before it.

  Args:
    q, k, v: [batch, length, heads, head_dim]. A length that is not a multiple
      of block is padded internally and the output cut back to length.
    block: the block size b.
    slots: the summaries per earlier block r.
    projection: a registered projection name or kind.
    key_weight, value_weight: E and F, as `weight` in block_summaries.
    key_padding_mask: optional [batch, length], True for real tokens.
    query_blocks_per_step: None computes every query block at once, holding
      logits [batch, heads, length, b + (length / b) * r], quadratic in length
      for fixed b. An int c runs c query blocks per step of jax.lax.map, holding
      logits [batch, heads, c * b, b + (length / b) * r], linear in length,
      in the backward pass too (each step is recomputed there). Both modes
      give the same result.
    dropout: dropout on the attention weights (training), or None; each query
      block draws its own mask (the key folded with the block's index), the
      same in both modes.

  Returns:
    [batch, length, heads, head_dim] in the dtype of q. Rows of padded queries
    carry no meaning (zero where no key is visible) but are finite and causal.
  """
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  if q.shape[1] != k.shape[1]:
    raise ValueError(f'Causal attention needs q and k of one length; got {q.shape}, {k.shape}.')
  if query_blocks_per_step is not None and query_blocks_per_step < 1:
    raise ValueError(f'query_blocks_per_step={query_blocks_per_step} must be None or at least 1.')
  projection = projections.kind(projection)
  common = dict(block=block, slots=slots, key_padding_mask=key_padding_mask)
  summary_k, summary_mask = block_summaries(k, projection, key_weight, name='E', **common)
  summary_v, _ = block_summaries(v, projection, value_weight, name='F', **common)

  batch, length, heads, head_dim = q.shape
  mask = _pad_to_blocks(k, key_padding_mask, block)[1]
  q, k, v = (_pad_to_blocks(x, None, block)[0] for x in (q, k, v))
  num_blocks = q.shape[1] // block
  slot_block = jnp.arange(summary_k.shape[1]) // slots
  causal = jnp.tril(jnp.ones((block, block), dtype=bool))

  def one_query_block(inputs):
    """Attention of the queries of one block; leading axis = blocks when mapped."""
    index, block_q, block_k, block_v, block_key_mask = inputs
    block_mask = causal[None] & block_key_mask[:, None, :]
    visible = summary_mask & (slot_block < index)[None]
    block_dropout = None if dropout is None else dropout.fold(index)
    return _attend_block_and_summaries(
        block_q, block_k, block_v, block_mask, summary_k, summary_v, visible, dropout=block_dropout
    )

  def by_block(x):
    return jnp.moveaxis(x.reshape(batch, num_blocks, block, *x.shape[2:]), 1, 0)

  inputs = (jnp.arange(num_blocks), by_block(q), by_block(k), by_block(v), by_block(mask))
  if query_blocks_per_step is None:
    out = jax.vmap(one_query_block)(inputs)
  else:
    # Rematerialised in the backward pass, so training too holds one step's logits.
    step = jax.checkpoint(one_query_block)
    out = jax.lax.map(step, inputs, batch_size=query_blocks_per_step)
  out = jnp.moveaxis(out, 0, 1).reshape(batch, num_blocks * block, heads, head_dim)
  return out[:, :length].astype(q.dtype)


class DecodeCache(NamedTuple):
  """What decode_step keeps between tokens; no entry grows with the position.

  Attributes:
    block_keys, block_values: [batch, block, heads, head_dim], the keys and
      values of the current block (entries past the current offset are stale).
    summary_keys: [batch, heads, head_dim, (max_len // block) * slots] and
      summary_values: [batch, heads, (max_len // block) * slots, head_dim], the
      summaries of finished blocks (slot s: block s // slots). Head-major, keys
      transposed: the layout the attention matmuls read without transposing them.
    summary_mask: [batch, (max_len // block) * slots], True for slots of
      finished blocks.
  """

  block_keys: Array
  block_values: Array
  summary_keys: Array
  summary_values: Array
  summary_mask: Array


def init_decode_cache(
    batch: int,
    max_len: int,
    heads: int,
    head_dim: int,
    *,
    block: int,
    slots: int,
    dtype=jnp.float32,
) -> DecodeCache:
  """An empty cache for decoding up to max_len tokens (max_len % block == 0)."""
  if block < 1 or max_len % block or not 1 <= slots <= block:
    raise ValueError(
        f'block={block} must divide max_len={max_len} and slots={slots} lie in [1, block].'
    )
  block_shape = (batch, block, heads, head_dim)
  num_slots = max_len // block * slots
  return DecodeCache(
      block_keys=jnp.zeros(block_shape, dtype),
      block_values=jnp.zeros(block_shape, dtype),
      summary_keys=jnp.zeros((batch, heads, head_dim, num_slots), dtype),
      summary_values=jnp.zeros((batch, heads, num_slots, head_dim), dtype),
      summary_mask=jnp.zeros((batch, num_slots), bool),
  )


def decode_step(
    cache: DecodeCache,
    q_t: Array,
    k_t: Array,
    v_t: Array,
    position: Array,
    *,
    block: int,
    slots: int,
    projection: Any,
    key_weight: Optional[Array],
    value_weight: Optional[Array],
) -> Tuple[Array, DecodeCache]:
  """Attention of the token at `position` during generation, and the new cache.

  The token's key and value go to entry position % block of the block buffer;
  the query attends, with one softmax, over the buffer entries up to there and
  over all (max_len // block) * slots summary slots, masked to finished blocks,
  so a token costs O(block + (max_len / block) * slots) at any position: the
  cost does not grow with the position at a fixed max_len. On the last token of
  a block the block is compressed into its slots (under lax.cond, so the other
  tokens skip it). Decoding assumes a prefix without padding, fed position by
  position from 0, and position < max_len (a traced value is not checked).

  Args:
    cache: from init_decode_cache or the previous decode_step.
    q_t, k_t, v_t: [batch, 1, heads, head_dim], the current token.
    position: int32 scalar (may be traced), shared by the batch.
    block, slots, projection, key_weight, value_weight: as in
      causal_block_attention.

  Returns:
    out_t [batch, 1, heads, head_dim] in q_t's dtype, and the updated cache.
  """
  projection = projections.kind(projection)
  _check_blocks(projection, key_weight, block, slots)
  _check_blocks(projection, value_weight, block, slots)
  attention.check_qkv(q_t, k_t, v_t)
  if q_t.shape[1] != 1 or cache.block_keys.shape[1] != block:
    raise ValueError(
        f'decode_step takes one token [batch, 1, heads, head_dim] and a cache built with '
        f'block={block}; got q_t {q_t.shape} and a cache block of {cache.block_keys.shape[1]}.'
    )
  max_len = cache.summary_mask.shape[1] // slots * block
  for weight in (key_weight, value_weight):
    projection.check_decode_len(weight, max_len)
  offset, block_index = position % block, position // block
  block_keys, block_values = (
      jax.lax.dynamic_update_slice_in_dim(buffer, x.astype(buffer.dtype), offset, axis=1)
      for buffer, x in ((cache.block_keys, k_t), (cache.block_values, v_t))
  )
  seen = jnp.broadcast_to(jnp.arange(block) <= offset, (q_t.shape[0], 1, block))
  summaries = (cache.summary_keys, cache.summary_values, cache.summary_mask)
  out_t = _attend_block_and_summaries(
      q_t, block_keys, block_values, seen, *summaries, head_major=True
  )

  # The block's r slots: compressed on its last token, else left as they are. Only these
  # slots pass through lax.cond and are written back outside it; passing the whole
  # summary buffers through the cond made XLA copy them all on every token.
  first_slot, slot_axes = block_index * slots, (3, 2, 1)  # of summary keys, values, mask
  current = tuple(
      jax.lax.dynamic_slice_in_dim(buffer, first_slot, slots, axis=axis)
      for buffer, axis in zip(summaries, slot_axes)
  )

  def compress_block(_):
    """The completed block's slots (by its weight rows, for matrices)."""
    weights = (
        projection.weight_for_block(key_weight, block_index, block),
        projection.weight_for_block(value_weight, block_index, block),
    )
    common = dict(block=block, slots=slots)
    new_keys, new_mask = block_summaries(block_keys, projection, weights[0], **common)
    new_values, _ = block_summaries(block_values, projection, weights[1], **common)
    new = (jnp.transpose(new_keys, (0, 2, 3, 1)), jnp.transpose(new_values, (0, 2, 1, 3)), new_mask)
    return tuple(x.astype(old.dtype) for x, old in zip(new, current))

  window = jax.lax.cond(offset == block - 1, compress_block, lambda c: c, current)
  summaries = tuple(
      jax.lax.dynamic_update_slice_in_dim(buffer, new, first_slot, axis=axis)
      for buffer, new, axis in zip(summaries, window, slot_axes)
  )
  return out_t.astype(q_t.dtype), DecodeCache(block_keys, block_values, *summaries)
