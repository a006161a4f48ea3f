"""'mean': average pooling over windows of max_len / k positions.

The mean runs over the real tokens of a window only; a window without one is
masked out of the softmax. No weights. Averaging commutes with the key and
value dense layers (each window's mean of x W + b is mean(x) W + b), so a
layer whose heads share the projection pools its input first.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.base import SequenceProjectionKind
from linformer_jax.model.projections.windows import to_windows

Array = jax.Array


def mean_pool(
    x: Array, *, window: int, max_len: int, key_padding_mask: Optional[Array] = None
) -> Tuple[Array, Array]:
  """Mean-pools x along the sequence axis with kernel = stride = window.

  Args:
    x: [batch, length, heads, head_dim], treated as padded to max_len.
    window: the pooling window and stride.
    max_len: the model's maximum sequence length n.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    pooled [batch, max_len // window, heads, head_dim] in x's dtype (the mean
    of each window's real tokens) and a [batch, max_len // window] mask, False
    for windows without real tokens.
  """
  windows, mask = to_windows(x, key_padding_mask, max_len, window)
  count = jnp.sum(mask, axis=2)
  total = jnp.sum(jnp.where(mask[..., None, None], windows.astype(jnp.float32), 0.0), axis=2)
  pooled = total / jnp.maximum(count, 1)[..., None, None]
  return pooled.astype(x.dtype), count > 0


@REGISTRY.register('mean')
class MeanPooling(SequenceProjectionKind):
  """Average pooling; see the module docstring."""

  compresses_first = True
  windowed = True
  mixes_positions_linearly = True

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del weight, name
    return mean_pool(
        x, window=max_len // projected_len, max_len=max_len, key_padding_mask=key_padding_mask
    )

  def compress_layer_input(
      self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'
  ):
    del weight, name
    pooled, mask = mean_pool(
        x[:, :, None, :],
        window=max_len // projected_len,
        max_len=max_len,
        key_padding_mask=key_padding_mask,
    )
    # Every window holding a real token averages the bias to itself.
    return pooled[:, :, 0], jnp.ones(mask.shape, jnp.float32), mask
