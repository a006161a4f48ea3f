"""'full': softmax attention over every position, the Transformer baseline.

Bidirectional and causal passes use `attention.dot_product_attention`'s math;
decoding keeps every position's key and value in the cache (variables 'keys'
and 'values', [batch, max_len, heads, head_dim]), so a token costs O(position).
"""

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind


@REGISTRY.register('full')
class FullAttention(AttentionKind):
  """Softmax attention over all keys; see the module docstring."""

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    del projection, config
    return attention.dot_product_attention(
        q, k, v, key_padding_mask=padding_mask, causal=True, dropout=self.weight_dropout
    )

  def init_cache(self, batch, config, projection, dtype):
    del projection
    shape = (batch, config.max_len, config.num_heads, config.head_dim)
    return {'keys': jnp.zeros(shape, dtype), 'values': jnp.zeros(shape, dtype)}

  def decode(self, cache, q, k, v, position, projection, config):
    del projection
    start = (0, position, 0, 0)
    keys = jax.lax.dynamic_update_slice(cache['keys'], k, start)
    values = jax.lax.dynamic_update_slice(cache['values'], v, start)
    batch = q.shape[0]
    visible = jnp.broadcast_to(jnp.arange(config.max_len) <= position, (batch, config.max_len))
    return attention.attend(q, keys, values, visible), {'keys': keys, 'values': values}
