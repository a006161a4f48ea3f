"""Splitting a sequence into windows, for the windowed projections.

Pooling, strided convolution and other projections that summarise windows of
`window` consecutive positions (window = stride = span / k) cut the sequence
with `to_windows`: the input is padded to max_len first, so every example
yields the same max_len / window compressed positions whatever its length.
The pooling kinds ('mean', 'max') are `WindowPooling`s: a reduction over each
window's real tokens (`pool_windows`), without weights.
"""

from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model.projections.base import SequenceProjectionKind

Array = jax.Array


def to_windows(x: Array, mask: Optional[Array], max_len: int, window: int) -> Tuple[Array, Array]:
  """Pads x and its mask to max_len and splits the sequence into windows.

  Args:
    x: [batch, length, heads, head_dim], length at most max_len.
    mask: optional [batch, length], True for real tokens (None: all real).
    max_len: the span the windows cover, a multiple of window.
    window: positions per window.

  Returns:
    x as [batch, max_len // window, window, heads, head_dim] and the mask as
    [batch, max_len // window, window], False for padding.
  """
  batch, length = x.shape[:2]
  if length > max_len:
    raise ValueError(
        f'Sequence length {length} is longer than max_len {max_len}; use '
        f'sequences of at most {max_len} tokens or a larger model.max_len.'
    )
  if mask is None:
    mask = jnp.ones((batch, length), dtype=bool)
  pad = max_len - length
  x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
  mask = jnp.pad(mask, ((0, 0), (0, pad)), constant_values=False)
  num_windows = max_len // window
  x = x.reshape(batch, num_windows, window, *x.shape[2:])
  return x, mask.reshape(batch, num_windows, window)


# A pooling's reduction: (windows [batch, windows, window, heads, head_dim] in
# float32, real [batch, windows, window, 1, 1], True for real tokens) -> the
# pooled [batch, windows, heads, head_dim].
Reduction = Callable[[Array, Array], Array]


def pool_windows(
    x: Array,
    reduce: Reduction,
    *,
    window: int,
    max_len: int,
    key_padding_mask: Optional[Array] = None,
) -> Tuple[Array, Array]:
  """Pools x along the sequence axis with kernel = stride = window, over each
  window's real tokens only.

  Args:
    x: [batch, length, heads, head_dim], treated as padded to max_len.
    reduce: the pooling (`Reduction`), in float32.
    window: the pooling window and stride.
    max_len: the model's maximum sequence length n.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    pooled [batch, max_len // window, heads, head_dim] in x's dtype, zero for
    a window without real tokens, and a [batch, max_len // window] mask, False
    for those windows.
  """
  windows, mask = to_windows(x, key_padding_mask, max_len, window)
  has_real = jnp.any(mask, axis=2)
  pooled = reduce(windows.astype(jnp.float32), mask[..., None, None])
  pooled = jnp.where(has_real[..., None, None], pooled, 0.0)
  return pooled.astype(x.dtype), has_real


class WindowPooling(SequenceProjectionKind):
  """A projection kind that pools windows of max_len / k positions with its
  `reduce` (a `Reduction`); no weights."""

  windowed = True

  @staticmethod
  def reduce(windows: Array, real: Array) -> Array:
    raise NotImplementedError

  def pool(
      self, x: Array, *, window: int, max_len: int, key_padding_mask: Optional[Array] = None
  ) -> Tuple[Array, Array]:
    return pool_windows(
        x, self.reduce, window=window, max_len=max_len, key_padding_mask=key_padding_mask
    )

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del weight, name
    return self.pool(
        x, window=max_len // projected_len, max_len=max_len, key_padding_mask=key_padding_mask
    )
