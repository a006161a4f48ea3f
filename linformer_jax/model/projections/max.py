"""'max': max pooling over windows of max_len / k positions.

The maximum runs over the real tokens of a window only; a window without one
is zero and masked out of the softmax. No weights.
"""

import functools

import jax.numpy as jnp

from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.windows import WindowPooling
from linformer_jax.model.projections.windows import pool_windows


@REGISTRY.register('max')
class MaxPooling(WindowPooling):
  """Max pooling; see the module docstring."""

  @staticmethod
  def reduce(windows, real):
    return jnp.max(jnp.where(real, windows, -jnp.inf), axis=2)


# max_pool(x, *, window, max_len, key_padding_mask=None) -> (pooled, mask), as
# `windows.pool_windows`.
max_pool = functools.partial(pool_windows, reduce=MaxPooling.reduce)
