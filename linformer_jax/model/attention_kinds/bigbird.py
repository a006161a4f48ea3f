"""'bigbird': window, global and random key blocks, Zaheer et al. 2020 (BigBird-ITC).

"Big Bird: Transformers for Longer Sequences". The sequence is cut into
blocks of b = model.bigbird_block_size positions, and every query of block q
sees the keys of

  the window        blocks q - 1, q and q + 1;
  the global blocks the first G = model.bigbird_global_blocks blocks, whose
                    queries in turn see every key (the ITC construction:
                    global tokens taken from the input);
  random blocks     R = model.bigbird_random_blocks other blocks per query
                    block, never a window or a global block.

Blocked (`blocked`): each query block gathers its 3 + R blocks, the G b global
keys are a part every query shares, and the G b global queries attend densely;
memory O(n ((3 + R) b + G b)) per head. There is no causal form
(`supports_causal = False`: model.causal=True is a config error), as in the
paper's encoder.

The random blocks are fixed per layer: a `Constant` 'random_priorities',
[max_blocks, max_blocks] uniform numbers drawn from the run's seed when the
model is initialised (so they differ from layer to layer, are saved in
checkpoints and never trained), with max_blocks = ceil(max_len / b). Query
block q takes the R blocks of highest priority among its candidates: the
blocks that are neither global nor in its window and that hold a real token of
the example (`bigbird_key_blocks`). Priorities rather than drawn indices let
the choice follow each example: a block of padding only is never picked (it
would spend a slot on keys that are all masked), and padding appended
to a sequence changes no real token's blocks, so outputs of real tokens do not
depend on how far a batch is padded. Fewer than R candidates (short
sequences) leave the rest of the slots empty.
"""

from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model.attention_kinds import blocked
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import Constant
from linformer_jax.registry import Setting

Array = jax.Array


class BigBirdPattern(NamedTuple):
  """The settings of the pattern: block length b, G global and R random blocks."""

  block: int
  global_blocks: int
  random_blocks: int


def random_priorities(key: Array, shape, dtype=jnp.float32) -> Array:
  """Uniform priorities in [0, 1) [query blocks, key blocks] (a Flax initializer)."""
  return jax.random.uniform(key, shape, dtype)


def bigbird_key_blocks(
    priorities: Array, real_blocks: Array, pattern: BigBirdPattern
) -> Tuple[Array, Array]:
  """The window and random key blocks of every query block.

  Args:
    priorities: [max_blocks, max_blocks], query block by key block.
    real_blocks: bool [batch, blocks], the blocks holding a real token.
    pattern: the block length and the numbers of global and random blocks.

  Returns:
    (block_ids, valid), int32 and bool [batch, blocks, 3 + min(R, blocks)]:
    the window's blocks q - 1, q, q + 1, then the random blocks in order of
    priority; a slot past either end, in a global block (the global part's)
    or without a candidate is not valid.
  """
  batch, num_blocks = real_blocks.shape
  if num_blocks > priorities.shape[0]:
    raise ValueError(
        f'a sequence of {num_blocks} blocks is longer than the random priorities, which '
        f'cover {priorities.shape[0]} blocks (max_len); use a shorter sequence.'
    )
  window, window_valid = blocked.neighbour_blocks(num_blocks, (-1, 0, 1))
  window_valid &= window >= pattern.global_blocks
  block_ids = jnp.broadcast_to(window, (batch, *window.shape))
  valid = jnp.broadcast_to(window_valid, (batch, *window.shape))
  if not pattern.random_blocks:
    return block_ids, valid
  query_block = jnp.arange(num_blocks)[:, None]
  key_block = jnp.arange(num_blocks)[None, :]
  candidate = (key_block >= pattern.global_blocks) & (jnp.abs(key_block - query_block) > 1)
  candidate = candidate[None] & real_blocks[:, None, :]  # [batch, query block, key block]
  # Priorities are >= 0, so a picked -1 is a slot no candidate was left for.
  scores = jnp.where(candidate, priorities[:num_blocks, :num_blocks], -1.0)
  picked_scores, picked = jax.lax.top_k(scores, min(pattern.random_blocks, num_blocks))
  block_ids = jnp.concatenate([block_ids, picked.astype(jnp.int32)], axis=-1)
  valid = jnp.concatenate([valid, picked_scores >= 0], axis=-1)
  return block_ids, valid


def _every_pair(query_position: Array, key_position: Array) -> Array:
  """The block pattern leaves no position of a gathered block out."""
  return jnp.ones(jnp.broadcast_shapes(query_position.shape, key_position.shape), bool)


def bigbird_attention(
    q: Array,
    k: Array,
    v: Array,
    priorities: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    pattern: BigBirdPattern,
) -> Array:
  """BigBird-ITC attention of [batch, length, heads, head_dim] q, k, v.

  Args:
    q, k, v: [batch, length, heads, head_dim], queries aligned with keys.
    priorities: [max_blocks, max_blocks], the layer's random priorities.
    key_padding_mask: optional [batch, length], True for real tokens.
    pattern: the block length and the numbers of global and random blocks.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  blocks = blocked.to_blocks(q, k, v, key_padding_mask, pattern.block)
  block_ids, valid = bigbird_key_blocks(priorities, jnp.any(blocks.real, axis=-1), pattern)
  global_positions = min(pattern.global_blocks * pattern.block, blocks.num_blocks * blocks.block)
  parts = [blocked.local_part(blocks, block_ids, valid, _every_pair)]
  dense = None
  if global_positions:
    global_keys = jnp.arange(global_positions, dtype=jnp.int32)
    parts.append(blocked.shared_keys_part(blocks, global_keys, _every_pair))
    dense = blocked.dense_rows(blocks, global_positions, _every_pair)
  return blocked.finish(blocked.merge_parts(parts), blocks, dense)


@REGISTRY.register('bigbird')
class BigBird(blocked.PatternKind):
  """Window, global and fixed random blocks; see the module docstring."""

  supports_causal = False

  settings = (
      Setting(
          'bigbird_block_size',
          int,
          64,
          minimum=1,
          allowed='use a positive integer (b, the positions per block)',
          help_text='b, the positions per block',
      ),
      Setting(
          'bigbird_global_blocks',
          int,
          1,
          minimum=0,
          allowed='use an integer >= 0 (the first blocks, which see and are seen by all)',
          help_text='the first blocks, which see and are seen by all',
      ),
      Setting(
          'bigbird_random_blocks',
          int,
          3,
          minimum=0,
          allowed='use an integer >= 0 (random key blocks per query block)',
          help_text='random key blocks per query block',
      ),
  )

  def pattern_of(self, config):
    return BigBirdPattern(
        block=config.setting('bigbird_block_size'),
        global_blocks=config.setting('bigbird_global_blocks'),
        random_blocks=config.setting('bigbird_random_blocks'),
    )

  def constants(self, config):
    max_blocks = -(-config.max_len // config.setting('bigbird_block_size'))
    return {'random_priorities': Constant(shape=(max_blocks, max_blocks), init=random_priorities)}

  def bidirectional(self, q, k, v, key_padding_mask, pattern):
    priorities = self.constant_values['random_priorities']
    return bigbird_attention(q, k, v, priorities, key_padding_mask, pattern=pattern)

  def visible_pairs(self, length, key_padding_mask, pattern):
    # Block by block: the global blocks' queries and keys, then each query
    # block's window and random blocks (`bigbird_key_blocks`), by position.
    num_blocks = -(-length // pattern.block)
    real = jnp.ones((1, length), bool) if key_padding_mask is None else key_padding_mask
    real = jnp.pad(real, ((0, 0), (0, num_blocks * pattern.block - length)))
    real_blocks = jnp.any(real.reshape(real.shape[0], num_blocks, pattern.block), axis=-1)
    block_ids, valid = bigbird_key_blocks(
        self.constant_values['random_priorities'], real_blocks, pattern
    )
    gathered = (block_ids[..., None] == jnp.arange(num_blocks)) & valid[..., None]
    block = jnp.arange(num_blocks)
    is_global = block < pattern.global_blocks
    block_visible = (
        jnp.any(gathered, axis=-2) | is_global[None, :, None] | is_global[None, None, :]
    )  # [batch, query block, key block]
    position_block = jnp.arange(length) // pattern.block
    return block_visible[:, position_block][:, :, position_block]
