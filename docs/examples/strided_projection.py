"""A sequence projection of your own: strided sampling, registered as 'strided'.

Keys and values are compressed by keeping one position per window of
max_len / k positions (its first), with no weights: the cheapest projection a
Linformer can have, and a baseline for what the learned ones add. Train with it:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/strided \
      --config.extensions="('docs/examples/strided_projection.py',)" \
      --config.model.projection=strided

Being windowed, it also serves the causal Linformer (each block of block_len
tokens keeps every (block_len / k)-th position) with no more code.
"""

import jax.numpy as jnp

from linformer_jax.model import projections
from linformer_jax.model.projections.windows import to_windows


def strided_sample(x, *, window, max_len, key_padding_mask=None):
  """The first position of each window of x [batch, length, ...].

  Returns:
    [batch, max_len // window, ...] and its mask, False where the kept
    position is padding (the softmax never attends to it).
  """
  # to_windows wants [batch, length, heads, head_dim]; a layer input has no heads axis.
  layer_input = x.ndim == 3
  windows, mask = to_windows(x[:, :, None] if layer_input else x, key_padding_mask, max_len, window)
  sampled = windows[:, :, 0]
  return (sampled[:, :, 0] if layer_input else sampled), mask[:, :, 0]


@projections.REGISTRY.register('strided')
class StridedSampling(projections.SequenceProjectionKind):
  """Keeps every (max_len / k)-th key and value."""

  windowed = True  # max_len (block_len when causal) must be a multiple of k
  # Picking rows commutes with the key/value dense layers: a layer whose heads
  # share the projection samples its input first and projects k rows, not n.
  compresses_first = True

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    return strided_sample(
        x, window=max_len // projected_len, max_len=max_len, key_padding_mask=key_padding_mask
    )

  def compress_layer_input(
      self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'
  ):
    rows, mask = self.compress(
        x, weight, max_len=max_len, projected_len=projected_len, key_padding_mask=key_padding_mask
    )
    return rows, jnp.ones(mask.shape, jnp.float32), mask  # every kept row keeps its bias once
