"""'max': max pooling over windows of max_len / k positions.

The maximum runs over the real tokens of a window only; a window without one
is zero and masked out of the softmax. No weights.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.base import SequenceProjectionKind
from linformer_jax.model.projections.windows import to_windows

Array = jax.Array


def max_pool(
    x: Array, *, window: int, max_len: int, key_padding_mask: Optional[Array] = None
) -> Tuple[Array, Array]:
  """Max-pools x along the sequence axis with kernel = stride = window.

  Args:
    x: [batch, length, heads, head_dim], treated as padded to max_len.
    window: the pooling window and stride.
    max_len: the model's maximum sequence length n.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    pooled [batch, max_len // window, heads, head_dim] in x's dtype and a
    [batch, max_len // window] mask, False for windows without real tokens.
  """
  windows, mask = to_windows(x, key_padding_mask, max_len, window)
  count = jnp.sum(mask, axis=2)
  pooled = jnp.max(jnp.where(mask[..., None, None], windows.astype(jnp.float32), -jnp.inf), axis=2)
  pooled = jnp.where((count > 0)[..., None, None], pooled, 0.0)
  return pooled.astype(x.dtype), count > 0


@REGISTRY.register('max')
class MaxPooling(SequenceProjectionKind):
  """Max pooling; see the module docstring."""

  windowed = True

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del weight, name
    return max_pool(
        x, window=max_len // projected_len, max_len=max_len, key_padding_mask=key_padding_mask
    )
