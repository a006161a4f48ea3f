"""'sparse_transformer': the fixed and strided patterns of Child et al. 2019.

"Generating Long Sequences with Sparse Transformers". With l =
model.sparse_block_size (the stride) and c = model.sparse_summary_size, the
causal patterns (model.sparse_pattern) let query i see key j <= i when

  'fixed'    j is in i's block of l (i // l = j // l), or j is one of the
             last c positions of an earlier block (j mod l >= l - c, its
             "summary");
  'strided'  j is one of the previous l positions (i - j <= l), or every
             l-th earlier position ((i - j) mod l = 0).

The paper splits the two halves of each pattern between heads or layers; here
every head sees their union, as its "merged" variant does.

Bidirectional, each pattern is mirrored: the condition j <= i is dropped, so
'fixed' sees i's whole block and the summaries of every other block, earlier
or later, and 'strided' sees the l positions on each side (|i - j| <= l) and
every l-th position either way.

Blocked (`blocked`), in blocks of l: 'fixed' gathers each query's own block
and shares the n c / l summary keys among all queries, O(n (l + n c / l)) per
head; 'strided' gathers the block and its neighbours (the window), and groups
the queries by their offset within a block, each group seeing the keys at
that offset, O(n (3 l + n / l)). Decoding keeps every position's key and
value (variables 'keys' and 'values') and attends with the token's row of the
pattern, O(max_len) per token.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from linformer_jax.errors import ConfigError
from linformer_jax.model.attention_kinds import blocked
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.registry import Setting

Array = jax.Array

PATTERNS = ('fixed', 'strided')


class SparsePattern(NamedTuple):
  """The settings of the pattern.

  Attributes:
    kind: 'fixed' or 'strided'.
    block: l, the block length and the stride.
    summary: c, the summary positions at the end of each block ('fixed').
  """

  kind: str
  block: int
  summary: int


def sparse_visible(
    query_position: Array, key_position: Array, pattern: SparsePattern, causal: bool
) -> Array:
  """Where query i sees key j (int position arrays that broadcast)."""
  block = pattern.block
  if pattern.kind == 'fixed':
    same_block = query_position // block == key_position // block
    visible = same_block | (key_position % block >= block - pattern.summary)
  else:
    distance = query_position - key_position
    visible = (jnp.abs(distance) <= block) | (distance % block == 0)
  if causal:
    visible &= key_position <= query_position
  return visible


def _by_offset(x: Array) -> Array:
  """[batch, blocks, block, ...] <-> [batch, block, blocks, ...]."""
  return jnp.swapaxes(x, 1, 2)


def _stride_part(blocks: blocked.Blocks, rule: blocked.Rule) -> blocked.PartialSoftmax:
  """Every query over the keys at its own offset in blocks two or more away
  from its own (those nearer are the window's): the queries grouped by their
  offset t within a block, each group one row of l blocks apart."""
  offset_positions = blocked.positions(blocks.num_blocks, blocks.block).T  # [block, blocks]
  i, j = offset_positions[:, :, None], offset_positions[:, None, :]
  visible = (rule(i, j) & (jnp.abs(i - j) > blocks.block))[None]
  visible &= _by_offset(blocks.real)[:, :, None, :]
  part = blocked.softmax_part(
      _by_offset(blocks.q), _by_offset(blocks.k), _by_offset(blocks.v), visible
  )
  return blocked.flat_part(jax.tree_util.tree_map(_by_offset, part))


def sparse_transformer_attention(
    q: Array,
    k: Array,
    v: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    pattern: SparsePattern,
    causal: bool = False,
) -> Array:
  """Sparse Transformer attention of [batch, length, heads, head_dim] q, k, v.

  Args:
    q, k, v: [batch, length, heads, head_dim], queries aligned with keys.
    key_padding_mask: optional [batch, length], True for real tokens.
    pattern: 'fixed' or 'strided', the block l and the summary c.
    causal: query i sees keys j <= i only.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  blocks = blocked.to_blocks(q, k, v, key_padding_mask, pattern.block)
  rule = functools.partial(sparse_visible, pattern=pattern, causal=causal)
  num_blocks = blocks.num_blocks
  if pattern.kind == 'fixed':
    own_block, valid = blocked.neighbour_blocks(num_blocks, (0,))
    summaries = (
        jnp.arange(num_blocks, dtype=jnp.int32)[:, None] * pattern.block
        + jnp.arange(pattern.block - pattern.summary, pattern.block, dtype=jnp.int32)
    ).reshape(-1)
    # The own block's summaries are the own-block part's.
    other_block = lambda i, j: rule(i, j) & (i // pattern.block != j // pattern.block)
    parts = [
        blocked.local_part(blocks, own_block, valid, rule),
        blocked.shared_keys_part(blocks, summaries, other_block),
    ]
  else:
    window, valid = blocked.neighbour_blocks(num_blocks, (-1, 0) if causal else (-1, 0, 1))
    parts = [blocked.local_part(blocks, window, valid, rule), _stride_part(blocks, rule)]
  return blocked.finish(blocked.merge_parts(parts), blocks)


@REGISTRY.register('sparse_transformer')
class SparseTransformer(blocked.PatternKind):
  """The fixed or strided sparse pattern; see the module docstring."""

  settings = (
      Setting(
          'sparse_pattern',
          str,
          'fixed',
          choices=PATTERNS,
          allowed=f'use one of {PATTERNS}',
          help_text="Child et al.'s 'fixed' or 'strided' pattern",
      ),
      Setting(
          'sparse_block_size',
          int,
          128,
          minimum=1,
          allowed='use a positive integer (l, the block length and stride)',
          help_text='l, the block length and stride',
      ),
      Setting(
          'sparse_summary_size',
          int,
          8,
          minimum=1,
          allowed='use a positive integer (c, the summary positions ending each block)',
          help_text='c, the summary positions ending each block',
      ),
  )

  def pattern_of(self, config):
    pattern = SparsePattern(
        kind=config.setting('sparse_pattern'),
        block=config.setting('sparse_block_size'),
        summary=config.setting('sparse_summary_size'),
    )
    # A Setting checks one value; this one is bounded by another (and only
    # the fixed pattern has summaries).
    if pattern.kind == 'fixed' and pattern.summary > pattern.block:
      raise ConfigError(
          f'config.model.sparse_summary_size={pattern.summary!r} is not allowed: use at most '
          f'sparse_block_size={pattern.block} (the summary is the end of each block) '
          "(a setting of attention='sparse_transformer')."
      )
    return pattern

  def bidirectional(self, q, k, v, key_padding_mask, pattern):
    return sparse_transformer_attention(q, k, v, key_padding_mask, pattern=pattern)

  def visible_pairs(self, length, key_padding_mask, pattern):
    del key_padding_mask  # the pattern is the same for every example
    position = jnp.arange(length, dtype=jnp.int32)
    return sparse_visible(position[:, None], position[None, :], pattern, causal=False)[None]

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del projection
    pattern = self.pattern_of(config)
    return sparse_transformer_attention(q, k, v, padding_mask, pattern=pattern, causal=True)

  def init_cache(self, batch, config, projection, dtype):
    del projection
    return blocked.init_position_cache(batch, config, dtype)

  def decode(self, cache, q, k, v, position, projection, config):
    del projection
    rule = functools.partial(sparse_visible, pattern=self.pattern_of(config), causal=True)
    return blocked.decode_by_rule(cache, q, k, v, position, rule)
