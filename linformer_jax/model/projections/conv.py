"""'conv': a learned strided convolution along the sequence.

Kernel size = stride = window = max_len / k (block_len / r when causal): each
compressed position mixes one window of consecutive positions and the
head_dim features of each head. The kernel is [window, head_dim, head_dim],
with a leading heads axis for one kernel per head (sharing='none').
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import logical_axes as axes
from linformer_jax.model import precision
from linformer_jax.model.declarations import Parameter
from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.base import SequenceProjectionKind
from linformer_jax.model.projections.windows import to_windows

Array = jax.Array


def conv_sequence(
    x: Array, kernel: Array, *, max_len: int, key_padding_mask: Optional[Array] = None
) -> Tuple[Array, Array]:
  """A strided convolution along the sequence, kernel size = stride = window.

  out[w] = sum_{j,c} x[w*window + j, c] K[j, c, :]. Padded positions are
  zeroed, and windows with no real token are masked.

  Args:
    x: [batch, length, heads, head_dim].
    kernel: [window, head_dim, head_dim] (shared by all heads) or
      [heads, window, head_dim, head_dim] (one per head).
    max_len: the model's maximum sequence length n (a multiple of window).
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    [batch, max_len // window, heads, head_dim] in x's dtype and the
    [batch, max_len // window] mask of windows holding real tokens.
  """
  window = kernel.shape[-3]
  x_real = attention.zero_padding(x, key_padding_mask)
  windows, mask = to_windows(x_real, key_padding_mask, max_len, window)
  equation = 'bwjhc,jcd->bwhd' if kernel.ndim == 3 else 'bwjhc,hjcd->bwhd'
  out = precision.einsum(equation, windows, kernel.astype(windows.dtype))
  return out.astype(x.dtype), jnp.any(mask, axis=2)


@REGISTRY.register('conv')
class StridedConvolution(SequenceProjectionKind):
  """A learned strided convolution; see the module docstring."""

  windowed = True
  weight_ndim = 3

  def weight_shape(self, *, config, projected_len, per_head):
    heads = (config.num_heads,) if per_head else ()
    window = config.compressed_span // projected_len
    return heads + (window, config.head_dim, config.head_dim)

  def weight(self, *, config, projected_len, per_head):
    shape = self.weight_shape(config=config, projected_len=projected_len, per_head=per_head)
    # Not axes.HEADS: projections stay replicated unless a rule names them.
    head_axes = (axes.PROJECTION_HEADS,) if per_head else ()
    names = head_axes + (axes.CONV_WINDOW, axes.HEAD_DIM_IN, axes.HEAD_DIM)
    fan_in = jax.nn.initializers.variance_scaling(
        1.0, 'fan_in', 'normal', in_axis=(-3, -2), out_axis=-1
    )
    return Parameter(shape, fan_in, names)

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del projected_len, name
    return conv_sequence(x, weight, max_len=max_len, key_padding_mask=key_padding_mask)

  def check_blocks(self, weight, block, slots):
    super().check_blocks(weight, block, slots)
    if weight is None or weight.shape[-3] != block // slots:
      raise ValueError(
          f'The conv kernel window must be block // slots = {block // slots}; got kernel shape '
          f'{None if weight is None else weight.shape}.'
      )
