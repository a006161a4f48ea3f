"""Splitting a sequence into windows, for the windowed projections.

Pooling, strided convolution and other projections that summarise windows of
`window` consecutive positions (window = stride = span / k) cut the sequence
with `to_windows`: the input is padded to max_len first, so every example
yields the same max_len / window compressed positions whatever its length.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

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
