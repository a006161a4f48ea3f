"""'longformer': a sliding window plus a few global tokens, Beltagy et al. 2020.

"Longformer: The Long-Document Transformer". With w = model.longformer_window
and g = model.longformer_global_tokens, query i sees key j when

  |i - j| <= w / 2          the window: w / 2 positions each side, and i itself;
  j < g  or  i < g          the first g positions (the CLS token by default)
                            see every key and every query sees them.

Blocked (`blocked`): blocks of w / 2 positions, each query block gathering
its own block and its two neighbours, which hold its whole window, masked to
the exact window; the g global keys are a part every query shares, and the g
global queries attend densely over all n keys. Memory O(n (1.5 w + g)) per
head. The paper's dilated windows and per-task choice of global tokens are
left out: here the global tokens are the first g positions of every sequence.

Causal (config.model.causal): the window's left half, j in [i - w / 2, i], and
a global token j < g when j <= i; no later position enters a query's softmax.
Decoding keeps every position's key and value in the cache (variables 'keys'
and 'values', as 'full' does) and attends with the token's row of the
pattern, O(max_len) per token.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from linformer_jax.model.attention_kinds import blocked
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.registry import Setting

Array = jax.Array


class LongformerPattern(NamedTuple):
  """The settings of the pattern: window w (even) and global tokens g."""

  window: int
  global_tokens: int


def longformer_visible(
    query_position: Array, key_position: Array, pattern: LongformerPattern, causal: bool
) -> Array:
  """Where query i sees key j (int position arrays that broadcast)."""
  near = jnp.abs(query_position - key_position) <= pattern.window // 2
  global_pair = (key_position < pattern.global_tokens) | (query_position < pattern.global_tokens)
  visible = near | global_pair
  if causal:
    visible &= key_position <= query_position
  return visible


def longformer_attention(
    q: Array,
    k: Array,
    v: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    pattern: LongformerPattern,
    causal: bool = False,
) -> Array:
  """Longformer attention of [batch, length, heads, head_dim] q, k, v.

  Args:
    q, k, v: [batch, length, heads, head_dim], queries aligned with keys.
    key_padding_mask: optional [batch, length], True for real tokens.
    pattern: the window and the number of global tokens.
    causal: query i sees keys j <= i only.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  blocks = blocked.to_blocks(q, k, v, key_padding_mask, pattern.window // 2)
  rule = functools.partial(longformer_visible, pattern=pattern, causal=causal)
  global_tokens = min(pattern.global_tokens, blocks.length)
  # Its own block and the neighbours hold the window of every query in a
  # block of w / 2; causal, the right-hand neighbour holds none of it.
  block_ids, slot_valid = blocked.neighbour_blocks(
      blocks.num_blocks, (-1, 0) if causal else (-1, 0, 1)
  )
  # The global keys are the shared part's: the window leaves them out.
  in_window = lambda i, j: rule(i, j) & (j >= global_tokens)
  parts = [blocked.local_part(blocks, block_ids, slot_valid, in_window)]
  dense = None
  if global_tokens:
    global_keys = jnp.arange(global_tokens, dtype=jnp.int32)
    parts.append(blocked.shared_keys_part(blocks, global_keys, rule))
    dense = blocked.dense_rows(blocks, global_tokens, rule)
  return blocked.finish(blocked.merge_parts(parts), blocks, dense)


@REGISTRY.register('longformer')
class Longformer(blocked.PatternKind):
  """A sliding window and global tokens; see the module docstring."""

  settings = (
      Setting(
          'longformer_window',
          int,
          256,
          check=lambda value: value >= 2 and value % 2 == 0,
          allowed='use an even positive integer (w, the window: w / 2 positions each side)',
          help_text='w, the sliding window: w / 2 positions each side',
      ),
      Setting(
          'longformer_global_tokens',
          int,
          1,
          minimum=0,
          allowed='use an integer >= 0 (the first positions, which see and are seen by all)',
          help_text='the first positions, which see and are seen by all',
      ),
  )

  def pattern_of(self, config):
    return LongformerPattern(
        window=config.setting('longformer_window'),
        global_tokens=config.setting('longformer_global_tokens'),
    )

  def bidirectional(self, q, k, v, key_padding_mask, pattern):
    return longformer_attention(q, k, v, key_padding_mask, pattern=pattern)

  def visible_pairs(self, length, key_padding_mask, pattern):
    del key_padding_mask  # the pattern is the same for every example
    position = jnp.arange(length, dtype=jnp.int32)
    return longformer_visible(position[:, None], position[None, :], pattern, causal=False)[None]

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del projection
    return longformer_attention(q, k, v, padding_mask, pattern=self.pattern_of(config), causal=True)

  def init_cache(self, batch, config, projection, dtype):
    del projection
    return blocked.init_position_cache(batch, config, dtype)

  def decode(self, cache, q, k, v, position, projection, config):
    del projection
    rule = functools.partial(longformer_visible, pattern=self.pattern_of(config), causal=True)
    return blocked.decode_by_rule(cache, q, k, v, position, rule)
