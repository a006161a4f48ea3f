"""Blocked sparse attention, shared by 'longformer', 'bigbird' and 'sparse_transformer'.

Each of these kinds lets query i see only the keys j of a pattern, a rule of
the two positions (`visible(i, j)`: a window, global tokens, random blocks,
strides). None of their passes forms the n x n logits or mask (only
`attention_weights`, for analyses, from `visible_pairs`). The sequence is cut
into blocks of b positions (padded at the end to a whole block, the padding
masked and cut off the output), and a query's visible keys fall into parts,
each a few keys per query:

  local part    `local_part`: every query block gathers a few key blocks
                (its neighbours, random ones), [blocks, slots] block indices;
                logits [n, slots * b];
  shared keys   `shared_keys_part`: keys that every query may see, a few
                positions (global tokens, block summaries); logits
                [n, shared];
  dense rows    `dense_rows`: the few queries that see every key (global
                tokens); logits [rows, n], rows << n.

A kind lays its parts out so that no key is in two of them, and masks each
part with its rule, the padding and (for gathered blocks) the slots that hold
no block. The softmax over the union of the parts is one softmax, computed
part by part (`softmax_part`: each part's weights relative to its own
largest logit, their sum and the weighted values) and merged exactly by
rescaling to the largest logit of all (`merge_parts`), as flash attention
merges its key blocks. Memory is O(n * (slots * b + shared)) per head.

A query that sees no real key (a padded query whose pattern holds only
padding) gets zeros: its weights are all zero rather than spread over the
padding, so outputs stay finite whatever the padding holds, and padded keys
and values are zeroed before any product.

Shapes follow `linformer_jax.model.attention`: q, k, v are [batch, length,
heads, head_dim], padding masks [batch, length], True for real tokens. Logits
come from `precision.einsum` in the inputs' dtype with float32 results; the
softmax runs in float32; outputs take q's dtype.

`PatternKind` is what the three kinds share as attention kinds: no softmax
kernel, queries that depend on their position, and a pattern that `attend`
reads from the config bound to the kind.
"""

from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model.attention_kinds.base import AttentionKind

Array = jax.Array
# A pattern's rule: (query positions, key positions), int arrays that
# broadcast, to a boolean array of where the query may see the key.
Rule = Callable[[Array, Array], Array]


class Blocks(NamedTuple):
  """A sequence padded to whole blocks.

  Attributes:
    q, k, v: [batch, blocks, block, heads, head_dim]; k and v are zero where
      no real key is.
    real: [batch, blocks, block], True for real keys (inside the input and
      not padding).
    length: the input's length n, to which outputs are cut back.
  """

  q: Array
  k: Array
  v: Array
  real: Array
  length: int

  @property
  def num_blocks(self) -> int:
    return self.k.shape[1]

  @property
  def block(self) -> int:
    return self.k.shape[2]

  def flat(self, x: Array) -> Array:
    """x [batch, blocks, block, ...] as [batch, blocks * block, ...]."""
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def to_blocks(
    q: Array, k: Array, v: Array, key_padding_mask: Optional[Array], block: int
) -> Blocks:
  """q, k, v [batch, length, heads, head_dim] cut into blocks of `block`."""
  attention.check_qkv(q, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  if q.shape[1] != k.shape[1]:
    raise ValueError(
        f'blocked attention aligns queries with keys position by position; got '
        f'{q.shape[1]} queries for {k.shape[1]} keys.'
    )
  batch, length = k.shape[:2]
  num_blocks = -(-length // block)
  extra = num_blocks * block - length
  real = jnp.ones((batch, length), bool) if key_padding_mask is None else key_padding_mask
  real = jnp.pad(real, [(0, 0), (0, extra)])
  pad = lambda x: jnp.pad(x, [(0, 0), (0, extra), (0, 0), (0, 0)])
  # Zeroed, so that neither a value nor a key's gradient carries what padding holds.
  k, v = (attention.zero_padding(pad(x), real) for x in (k, v))
  split = lambda x: x.reshape(batch, num_blocks, block, *x.shape[2:])
  return Blocks(split(pad(q)), split(k), split(v), split(real), length)


def positions(num_blocks: int, block: int) -> Array:
  """The positions of the blocks' rows: int32 [blocks, block]."""
  return jnp.arange(num_blocks * block, dtype=jnp.int32).reshape(num_blocks, block)


def neighbour_blocks(num_blocks: int, offsets: Sequence[int]) -> Tuple[Array, Array]:
  """Block b + offset for every block b: (indices, valid), int32 and bool
  [blocks, len(offsets)]; an index past either end is clipped and not valid."""
  ids = jnp.arange(num_blocks, dtype=jnp.int32)[:, None] + jnp.asarray(offsets, jnp.int32)
  valid = (ids >= 0) & (ids < num_blocks)
  return jnp.clip(ids, 0, num_blocks - 1), valid


def gather_blocks(x: Array, block_ids: Array) -> Array:
  """The blocks each query block gathers, side by side.

  Args:
    x: [batch, blocks, block, ...].
    block_ids: int [blocks, slots] (the same for every example) or [batch,
      blocks, slots], indices of blocks of x.

  Returns:
    [batch, blocks, slots * block, ...].
  """
  if block_ids.ndim == 2:
    gathered = x[:, block_ids]
  else:
    gathered = jax.vmap(lambda rows, ids: rows[ids])(x, block_ids)
  batch, groups, slots, block = gathered.shape[:4]
  return gathered.reshape(batch, groups, slots * block, *gathered.shape[4:])


class PartialSoftmax(NamedTuple):
  """Softmax attention over one part of each query's keys, not yet normalised.

  With s_j the visible logits of the part and m their largest:

  Attributes:
    numerator: float32 [..., heads, head_dim], sum_j exp(s_j - m) v_j.
    total: float32 [..., heads], sum_j exp(s_j - m); 0 where no key is visible.
    row_max: float32 [..., heads], m; MASKED_LOGIT where no key is visible.
  """

  numerator: Array
  total: Array
  row_max: Array


def softmax_part(queries: Array, keys: Array, values: Array, visible: Array) -> PartialSoftmax:
  """Each group of queries over its keys: one part of a blocked softmax.

  Args:
    queries: [batch, groups, group_len, heads, head_dim].
    keys, values: [batch, groups, slots, heads, head_dim], each group its own
      keys, or [batch, slots, heads, head_dim], keys every group shares.
    visible: bool, broadcasting to [batch, groups, group_len, slots].

  Returns:
    the part, [batch, groups, group_len, heads(, head_dim)].
  """
  keys_of = 'bgkhd' if keys.ndim == 5 else 'bkhd'
  logits = precision.einsum(f'bgqhd,{keys_of}->bgqhk', queries, keys.astype(queries.dtype))
  logits = logits / jnp.sqrt(jnp.float32(queries.shape[-1]))
  visible = jnp.expand_dims(visible, -2)  # over the heads
  masked = jnp.where(visible, logits, attention.MASKED_LOGIT)
  # The shift cancels in the merged softmax, so it takes no gradient.
  row_max = jax.lax.stop_gradient(jnp.max(masked, axis=-1))
  # Masked keys weigh exactly 0: a row that sees nothing sums to 0, not to a
  # uniform spread over keys it may not see.
  weights = jnp.where(visible, jnp.exp(masked - row_max[..., None]), 0.0)
  numerator = precision.einsum(f'bgqhk,{keys_of}->bgqhd', weights.astype(values.dtype), values)
  return PartialSoftmax(numerator, jnp.sum(weights, axis=-1), row_max)


def flat_part(part: PartialSoftmax) -> PartialSoftmax:
  """A part of query blocks [batch, blocks, block, ...] by position [batch, n, ...]."""
  return jax.tree_util.tree_map(lambda x: x.reshape(x.shape[0], -1, *x.shape[3:]), part)


def merge_parts(parts: Sequence[PartialSoftmax]) -> Array:
  """The softmax over the union of the parts' keys: float32 [..., heads, head_dim].

  Each part's sums are rescaled from its own largest logit to the largest
  of all, so the merge is the softmax of every visible key at once; a query
  that sees no key in any part gets zeros.
  """
  peak = jax.lax.stop_gradient(jnp.max(jnp.stack([part.row_max for part in parts]), axis=0))
  numerator, total = 0.0, 0.0
  for part in parts:
    scale = jnp.exp(part.row_max - peak)
    numerator = numerator + part.numerator * scale[..., None]
    total = total + part.total * scale
  return numerator / jnp.where(total > 0, total, 1.0)[..., None]


def local_part(blocks: Blocks, block_ids: Array, slot_valid: Array, rule: Rule) -> PartialSoftmax:
  """Each query block over the key blocks it gathers, by position.

  Args:
    blocks: the padded sequence.
    block_ids: int [blocks, slots] or [batch, blocks, slots], the key blocks
      of each query block.
    slot_valid: bool of block_ids' shape: False for a slot that holds no
      block (past an end, or a block another part covers).
    rule: the pattern's rule, restricted to this part's keys.

  Returns:
    the part, [batch, n_padded, heads(, head_dim)].
  """
  block = blocks.block
  query_positions = positions(blocks.num_blocks, block)  # [blocks, block]
  key_positions = (block_ids[..., None] * block + jnp.arange(block)).reshape(
      *block_ids.shape[:-1], -1
  )  # [(batch,) blocks, slots * block]
  visible = rule(query_positions[:, :, None], key_positions[..., None, :])
  visible &= jnp.repeat(slot_valid, block, axis=-1)[..., None, :]
  if visible.ndim == 3:
    visible = visible[None]
  visible &= gather_blocks(blocks.real, block_ids)[:, :, None, :]
  keys, values = gather_blocks(blocks.k, block_ids), gather_blocks(blocks.v, block_ids)
  return flat_part(softmax_part(blocks.q, keys, values, visible))


def shared_keys_part(blocks: Blocks, key_positions: Array, rule: Rule) -> PartialSoftmax:
  """Every query over a few keys all of them may see (the rule decides which).

  Args:
    blocks: the padded sequence.
    key_positions: int [shared], positions in the padded sequence.
    rule: the pattern's rule, restricted to this part's keys.

  Returns:
    the part, [batch, n_padded, heads(, head_dim)].
  """
  query_positions = positions(blocks.num_blocks, blocks.block)
  visible = rule(query_positions[:, :, None], key_positions[None, None, :])[None]
  visible &= blocks.flat(blocks.real)[:, key_positions][:, None, None, :]
  keys = blocks.flat(blocks.k)[:, key_positions]
  values = blocks.flat(blocks.v)[:, key_positions]
  return flat_part(softmax_part(blocks.q, keys, values, visible))


def dense_rows(blocks: Blocks, rows: int, rule: Rule) -> Array:
  """The first `rows` queries over every key they see: float32 [batch, rows,
  heads, head_dim], normalised; O(rows * n), for a few global queries."""
  n_padded = blocks.num_blocks * blocks.block
  every_position = jnp.arange(n_padded, dtype=jnp.int32)
  visible = rule(every_position[:rows, None], every_position[None, :])[None, None]
  visible &= blocks.flat(blocks.real)[:, None, None, :]
  queries = blocks.flat(blocks.q)[:, None, :rows]
  part = softmax_part(queries, blocks.flat(blocks.k), blocks.flat(blocks.v), visible)
  return merge_parts([jax.tree_util.tree_map(lambda x: x[:, 0], part)])


def finish(out: Array, blocks: Blocks, dense: Optional[Array] = None) -> Array:
  """The merged output [batch, n_padded, heads, head_dim], its first rows
  replaced by `dense` (a few queries that see every key) if given, cut back
  to the input's length, in q's dtype."""
  if dense is not None:
    out = out.at[:, : dense.shape[1]].set(dense)
  return out[:, : blocks.length].astype(blocks.q.dtype)


class PatternKind(AttentionKind):
  """What the blocked kinds share as attention kinds.

  A subclass defines `pattern_of(config)` (its settings, hashable, read from
  the config), `bidirectional(q, k, v, key_padding_mask, pattern)` and, for
  the attention weights analyses read, `visible_pairs(length,
  key_padding_mask, pattern)`.
  `attend` reads the pattern from the config `layers.SelfAttention` binds to
  the kind (`with_config`); a test that calls `attend` directly binds one the
  same way.

  The causal kinds decode through a cache of every position's key and value
  (as 'full' does): a token at position p attends with the pattern's row
  `visible(p, j)`, O(max_len) per token.
  """

  uses_kernel = False  # its own blocked softmax, no softmax kernel
  drops_attention_weights = False  # its softmax runs part by part, with no dropout
  # A query's keys depend on its position (its block, window or stride).
  queries_independent = False

  def pattern_of(self, config: Any) -> Any:
    """The pattern's settings, read from config.model."""
    raise NotImplementedError

  def bidirectional(
      self, q: Array, k: Array, v: Array, key_padding_mask: Optional[Array], pattern: Any
  ) -> Array:
    """The bidirectional pass: [batch, length, heads, head_dim] in q's dtype."""
    raise NotImplementedError

  def visible_pairs(self, length: int, key_padding_mask: Optional[Array], pattern: Any) -> Array:
    """Where the bidirectional pass lets query i see key j, padding aside:
    bool broadcasting to [batch, length, length] (a dense n x n mask, for
    analyses)."""
    raise NotImplementedError

  def _pattern(self) -> Any:
    if self.config is None:
      raise ValueError(
          f'attention={self.name!r}: attend reads its pattern from the model config; bind '
          'one with with_config(config) (layers.SelfAttention does) before calling it.'
      )
    return self.pattern_of(self.config)

  def attend(self, q, keys, values, key_mask, *, kernel):
    del kernel  # the kernels attend over every key; this kind gathers its own
    return self.bidirectional(q, keys, values, key_mask, self._pattern())

  def attention_weights(self, q, keys, values, key_mask):
    """The bidirectional pass as one dense softmax over `visible_pairs` and
    the real keys; a query that sees no real key gets a zero row, as its
    output is zero."""
    del values  # P does not depend on them
    length = keys.shape[1]
    visible = self.visible_pairs(length, key_mask, self._pattern())
    if key_mask is not None:
      visible = visible & key_mask[:, None, :]
    visible = jnp.broadcast_to(visible, (keys.shape[0], length, length))[:, None]
    logits = precision.einsum('bqhd,bkhd->bhqk', q, keys.astype(q.dtype))
    logits = logits / jnp.sqrt(jnp.float32(q.shape[-1]))
    weights = jax.nn.softmax(jnp.where(visible, logits, attention.MASKED_LOGIT), axis=-1)
    return jnp.where(jnp.any(visible, axis=-1, keepdims=True), weights, 0.0)


def init_position_cache(batch: int, config: Any, dtype) -> Dict[str, Array]:
  """Every position's key and value, [batch, max_len, heads, head_dim], zeros."""
  shape = (batch, config.max_len, config.num_heads, config.head_dim)
  return {'keys': jnp.zeros(shape, dtype), 'values': jnp.zeros(shape, dtype)}


def decode_by_rule(
    cache: Dict[str, Array], q: Array, k: Array, v: Array, position: Array, rule: Rule
) -> Tuple[Array, Dict[str, Array]]:
  """One token [batch, 1, heads, head_dim] at `position` over the cached keys
  its pattern row shows it (`rule` includes j <= position); returns its
  output in q's dtype and the new cache."""
  start = (0, position, 0, 0)
  keys = jax.lax.dynamic_update_slice(cache['keys'], k, start)
  values = jax.lax.dynamic_update_slice(cache['values'], v, start)
  every_position = jnp.arange(keys.shape[1], dtype=jnp.int32)
  row = rule(jnp.asarray(position, jnp.int32), every_position) & (every_position <= position)
  visible = jnp.broadcast_to(row, keys.shape[:2])
  return attention.attend(q, keys, values, visible), {'keys': keys, 'values': values}
