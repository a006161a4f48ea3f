"""'mean': average pooling over windows of max_len / k positions.

The mean runs over the real tokens of a window only; a window without one is
masked out of the softmax. No weights. Averaging commutes with the key and
value dense layers (each window's mean of x W + b is mean(x) W + b), so a
layer whose heads share the projection pools its input first.
"""

import functools

import jax.numpy as jnp

from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.windows import WindowPooling
from linformer_jax.model.projections.windows import pool_windows


@REGISTRY.register('mean')
class MeanPooling(WindowPooling):
  """Average pooling; see the module docstring."""

  compresses_first = True
  mixes_positions_linearly = True

  @staticmethod
  def reduce(windows, real):
    total = jnp.sum(jnp.where(real, windows, 0.0), axis=2)
    return total / jnp.maximum(jnp.sum(real, axis=2), 1)

  def compress_layer_input(
      self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'
  ):
    del weight, name
    pooled, mask = self.pool(
        x[:, :, None, :],
        window=max_len // projected_len,
        max_len=max_len,
        key_padding_mask=key_padding_mask,
    )
    # Every window holding a real token averages the bias to itself.
    return pooled[:, :, 0], jnp.ones(mask.shape, jnp.float32), mask


# mean_pool(x, *, window, max_len, key_padding_mask=None) -> (pooled, mask),
# as `windows.pool_windows`.
mean_pool = functools.partial(pool_windows, reduce=MeanPooling.reduce)
