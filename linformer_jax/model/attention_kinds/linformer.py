"""'linformer': attention over keys and values compressed along the sequence.

Bidirectional: every query attends over the k positions the layer's sequence
projection compresses the n keys and values into (`compressed_keys_and_values`),
softmax(Q (E^T K)^T / sqrt(d)) (F^T V) for a matrix projection. A layer whose
E and F are shared by the heads (any sharing but 'none'), with a projection
that commutes with the dense layers (`compresses_first`: linear, random,
mean), compresses its input first and projects the k compressed rows to keys
and values: the same result with the key and value matmuls on k rows instead
of n, and one compression for E = F.

Causal (config.model.causal): the block-wise Linformer of
`causal_linformer`, exact within a block of block_len tokens and compressed
(projected_len slots per block) before it; decoding keeps the current block
and the finished blocks' summaries in the cache (variable 'blocks').
"""

from typing import Any, Optional, Tuple

import jax

from linformer_jax.model import attention
from linformer_jax.model import projections
from linformer_jax.model.attention_kinds import causal_linformer
from linformer_jax.model.attention_kinds.base import ATTENDED
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind

Array = jax.Array


def compressed_keys_and_values(
    k: Array,
    v: Array,
    *,
    projection: Any,
    key_weight: Optional[Array],
    value_weight: Optional[Array],
    max_len: int,
    projected_len: int,
    key_padding_mask: Optional[Array] = None,
) -> Tuple[Array, Array, Array]:
  """Keys and values compressed along the sequence by a registered projection
  (a name or a kind) with `key_weight` and `value_weight`, the E and F of the
  paper; every query then attends over the projected_len positions
  (`attention.attend`).

  Returns:
    keys and values [batch, projected_len, heads, head_dim] and their
    [batch, projected_len] mask, False where a compressed position holds no
    real token.
  """
  attention.check_qkv(k, k, v)
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  projection = projections.kind(projection)
  common = dict(max_len=max_len, projected_len=projected_len, key_padding_mask=key_padding_mask)
  keys, key_mask = projection.compress(k, key_weight, name='E', **common)
  values, _ = projection.compress(v, value_weight, name='F', **common)
  return keys, values, key_mask


@REGISTRY.register('linformer')
class Linformer(AttentionKind):
  """Compressed keys and values; see the module docstring."""

  uses_projection = True

  def compressed_span(self, config):
    return config.block_len if config.causal else config.max_len

  def keys_and_values(self, x, padding_mask, dense, projection, config, *, compress_first, record):
    kind, key_weight, value_weight = projection.kind, projection.key_weight, projection.value_weight
    common = dict(
        max_len=config.max_len,
        projected_len=projection.projected_len,
        key_padding_mask=padding_mask,
    )
    # One compression of the input serves every head only when the heads share E and F.
    if compress_first and kind.compresses_first and config.sharing != 'none':
      key_rows, key_bias, key_mask = kind.compress_layer_input(x, key_weight, name='E', **common)
      if value_weight is key_weight:
        value_rows, value_bias = key_rows, key_bias
      else:
        value_rows, value_bias, _ = kind.compress_layer_input(x, value_weight, name='F', **common)
      keys = dense.keys_from_compressed(key_rows, key_bias)
      values = dense.values_from_compressed(value_rows, value_bias)
    else:
      keys, values, key_mask = compressed_keys_and_values(
          dense.keys(x),
          dense.values(x),
          projection=kind,
          key_weight=key_weight,
          value_weight=value_weight,
          **common,
      )
    record(ATTENDED, (keys, values, key_mask))
    return keys, values, key_mask

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    return causal_linformer.causal_block_attention(
        q,
        k,
        v,
        block=config.block_len,
        slots=projection.projected_len,
        projection=projection.kind,
        key_weight=projection.key_weight,
        value_weight=projection.value_weight,
        key_padding_mask=padding_mask,
        query_blocks_per_step=config.query_blocks_per_step or None,
        dropout=self.weight_dropout,
    )

  def init_cache(self, batch, config, projection, dtype):
    cache = causal_linformer.init_decode_cache(
        batch,
        config.max_len,
        config.num_heads,
        config.head_dim,
        block=config.block_len,
        slots=projection.projected_len,
        dtype=dtype,
    )
    return {'blocks': cache._asdict()}

  def decode(self, cache, q, k, v, position, projection, config):
    out, blocks = causal_linformer.decode_step(
        causal_linformer.DecodeCache(**cache['blocks']),
        q,
        k,
        v,
        position,
        block=config.block_len,
        slots=projection.projected_len,
        projection=projection.kind,
        key_weight=projection.key_weight,
        value_weight=projection.value_weight,
    )
    return out, {'blocks': blocks._asdict()}
