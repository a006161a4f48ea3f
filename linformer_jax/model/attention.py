"""Attention as pure functions of arrays: the Transformer baseline and Linformer.

Shapes follow one convention throughout:

  q, k, v             [batch, length, heads, head_dim]
  key_padding_mask    [batch, length], True for real tokens
  output              [batch, length, heads, head_dim]

Linformer (Wang et al., 2020) compresses keys and values along the sequence axis
from `length` to `projected_len` before the softmax, so attention costs
O(length * projected_len) instead of O(length^2):

  softmax(Q (E^T K)^T / sqrt(d)) (F^T V)

Padding is handled so that it never enters the compressed keys and values: padded
rows of K and V are zeroed before a learned/random projection, and pooling or
convolution windows ignore padded positions (a window holding no real token is
masked out of the softmax). An example's output is therefore the same whether it
is run alone or batched with longer, padded examples.

The softmax, its reductions and the sequence projections accumulate in float32
even when the inputs are bfloat16; outputs come back in the input dtype.
"""

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array

# Logit given to masked keys. Finite (not -inf) so that a row whose keys are all
# masked yields a uniform distribution instead of NaNs.
MASKED_LOGIT = -1e30


def _check_qkv(q: Array, k: Array, v: Array) -> None:
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
        'q, k and v must be [batch, length, heads, head_dim]; got shapes '
        f'{q.shape}, {k.shape}, {v.shape}.'
    )
  if k.shape != v.shape:
    raise ValueError(f'k and v must have the same shape; got {k.shape} and {v.shape}.')
  if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
    raise ValueError(
        f'q and k must agree on batch, heads and head_dim; got {q.shape} and {k.shape}.'
    )


def _check_mask(mask: Optional[Array], batch: int, length: int) -> None:
  if mask is not None and mask.shape != (batch, length):
    raise ValueError(
        f'key_padding_mask must be [batch, length] = {(batch, length)}; got {mask.shape}.'
    )


def attend(q: Array, k: Array, v: Array, key_mask: Optional[Array] = None) -> Array:
  """Softmax attention of every query over the given keys/values.

  Args:
    q: [batch, q_length, heads, head_dim] queries.
    k: [batch, kv_length, heads, head_dim] keys (possibly compressed).
    v: [batch, kv_length, heads, head_dim] values (possibly compressed).
    key_mask: optional boolean, True for keys that may be attended to:
      [batch, kv_length] for every query alike, or [batch, q_length,
      kv_length] per query (a causal mask).

  Returns:
    [batch, q_length, heads, head_dim] in the dtype of `q`.
  """
  head_dim = q.shape[-1]
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  logits = logits / jnp.sqrt(jnp.float32(head_dim))
  if key_mask is not None:
    mask = key_mask[:, None, None, :] if key_mask.ndim == 2 else key_mask[:, None]
    logits = jnp.where(mask, logits, MASKED_LOGIT)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum(
      'bhqk,bkhd->bqhd', weights, v.astype(jnp.float32), preferred_element_type=jnp.float32
  )
  return out.astype(q.dtype)


# How `attend_with` computes softmax attention: this module's einsums, or
# jax.nn.dot_product_attention with its XLA or cuDNN (flash attention, GPU)
# implementation.
ATTENTION_KERNELS = ('einsum', 'xla', 'cudnn')


def attend_with(
    kernel: str, q: Array, k: Array, v: Array, key_mask: Optional[Array] = None
) -> Array:
  """`attend` by the chosen kernel; key_mask is [batch, kv_length] or None."""
  if kernel == 'einsum':
    return attend(q, k, v, key_mask)
  if kernel not in ATTENTION_KERNELS:
    raise ValueError(f'attention kernel {kernel!r} is unknown; use one of {ATTENTION_KERNELS}.')
  mask = None if key_mask is None else key_mask[:, None, None, :]
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=kernel)
  return out.astype(q.dtype)


def dot_product_attention(
    q: Array, k: Array, v: Array, *, key_padding_mask: Optional[Array] = None, causal: bool = False
) -> Array:
  """Standard softmax attention, the Transformer baseline: softmax(QK^T/sqrt(d))V.

  Args:
    q, k, v: [batch, length, heads, head_dim].
    key_padding_mask: optional [batch, length], True for real tokens; padded
      keys get zero attention weight.
    causal: position t attends to positions <= t only (a language model's
      mask).

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  _check_qkv(q, k, v)
  _check_mask(key_padding_mask, k.shape[0], k.shape[1])
  if not causal:
    return attend(q, k, v, key_padding_mask)
  batch, length = k.shape[:2]
  mask = jnp.tril(jnp.ones((length, length), bool))[None]
  if key_padding_mask is not None:
    # Every position also sees itself, so no row is empty (an empty row would
    # spread its weight over every key, later ones included).
    mask = mask & (key_padding_mask[:, None, :] | jnp.eye(length, dtype=bool)[None])
  return attend(q, k, v, jnp.broadcast_to(mask, (batch, length, length)))


def zero_padding(x: Array, key_padding_mask: Optional[Array]) -> Array:
  """Zeroes the padded rows of x [batch, length, heads, head_dim]."""
  if key_padding_mask is None:
    return x
  return jnp.where(key_padding_mask[:, :, None, None], x, jnp.zeros_like(x))


def _rows_for_length(matrix: Array, length: int, name: str) -> Array:
  """The first `length` rows (sequence axis) of a projection matrix."""
  max_len = matrix.shape[-2]
  if length > max_len:
    raise ValueError(
        f'Sequence length {length} is longer than the projection {name}, which '
        f'covers {max_len} positions; use sequences of at most {max_len} tokens '
        'or a model with a larger max_len.'
    )
  return matrix[..., :length, :]


def project_sequence(
    x: Array, matrix: Array, *, key_padding_mask: Optional[Array] = None, name: str = 'E'
) -> Array:
  """Compresses x along its sequence axis with a projection matrix.

  Args:
    x: [batch, length, heads, head_dim].
    matrix: [max_len, projected_len] (one matrix for all heads) or
      [heads, max_len, projected_len] (one per head). Inputs shorter than
      max_len use the first `length` rows of the matrix, which is exactly what
      padding the input to max_len with zeros would give.
    key_padding_mask: optional [batch, length], True for real tokens. Padded
      rows of x are zeroed first, so padding never enters the result.
    name: the matrix's name, used in error messages.

  Returns:
    [batch, projected_len, heads, head_dim] in the dtype of x.
  """
  if matrix.ndim not in (2, 3):
    raise ValueError(
        f'Projection {name} must be [length, projected_len] or '
        f'[heads, length, projected_len]; got shape {matrix.shape}.'
    )
  if matrix.ndim == 3 and matrix.shape[0] != x.shape[2]:
    raise ValueError(
        f'Per-head projection {name} has {matrix.shape[0]} heads but the input '
        f'has {x.shape[2]}.'
    )
  rows = _rows_for_length(matrix, x.shape[1], name)
  x = zero_padding(x, key_padding_mask)
  equation = 'bnhd,nk->bkhd' if rows.ndim == 2 else 'bnhd,hnk->bkhd'
  # Upcast rather than ask for float32 accumulation of bfloat16 operands: the
  # sum runs over up to max_len positions, and XLA:CPU has no such mixed dot.
  out = jnp.einsum(equation, x.astype(jnp.float32), rows.astype(jnp.float32))
  return out.astype(x.dtype)


def compress_layer_input(
    x: Array,
    projection: str,
    weight: Optional[Array],
    *,
    max_len: int,
    projected_len: int,
    key_padding_mask: Optional[Array] = None,
    name: str = 'E',
) -> Tuple[Array, Array, Optional[Array]]:
  """Compresses a layer's input before its key or value projection.

  By linearity, E^T (m * (x W + b)) = (E^T (m * x)) W + (E^T m) b for a padding
  mask m, so keys and values can be projected from k compressed rows instead
  of n rows: the same result for fewer FLOPs. Mean pooling commutes the same
  way with the bias unscaled (every window with a real token averages to b).

  Args:
    x: [batch, length, features], the layer input.
    projection: 'linear' or 'random' (a matrix shared by all heads, [max_len,
      projected_len]) or 'mean'.
    weight: the matrix E (or F); None for 'mean'.
    max_len, projected_len: n and k.
    key_padding_mask: optional [batch, length], True for real tokens.
    name: the weight's name, used in error messages.

  Returns:
    the compressed input [batch, k, features] in x's dtype; the factor each
    compressed row's bias takes, float32 [batch, k] (E^T m, or 1 for 'mean');
    and the [batch, k] mask of compressed rows holding real tokens (None for a
    matrix).
  """
  if projection == 'mean':
    pooled, mask = pool_sequence(
        x[:, :, None, :],
        window=max_len // projected_len,
        max_len=max_len,
        kind='mean',
        key_padding_mask=key_padding_mask,
    )
    return pooled[:, :, 0], jnp.ones(mask.shape, jnp.float32), mask
  if projection not in ('linear', 'random') or weight is None or weight.ndim != 2:
    raise ValueError(
        f'compress_layer_input takes a matrix shared by all heads or mean pooling; got '
        f"projection={projection!r} with weight shape {getattr(weight, 'shape', None)}."
    )
  rows = _rows_for_length(weight, x.shape[1], name).astype(jnp.float32)
  if key_padding_mask is None:
    real = jnp.ones(x.shape[:2], jnp.float32)
  else:
    real = key_padding_mask.astype(jnp.float32)
    x = jnp.where(key_padding_mask[:, :, None], x, jnp.zeros_like(x))
  compressed = jnp.einsum('bnd,nk->bkd', x.astype(jnp.float32), rows)
  return compressed.astype(x.dtype), jnp.einsum('bn,nk->bk', real, rows), None


def linformer_attention(
    q: Array, k: Array, v: Array, e: Array, f: Array, *, key_padding_mask: Optional[Array] = None
) -> Array:
  """Linformer attention: softmax(Q (E^T K)^T / sqrt(d)) (F^T V).

  Args:
    q, k, v: [batch, length, heads, head_dim].
    e, f: key and value projections, each [max_len, projected_len] (shared by
      all heads) or [heads, max_len, projected_len] (one per head). Inputs
      shorter than max_len use the first `length` rows of e and f; a length
      longer than max_len is an error.
    key_padding_mask: optional [batch, length], True for real tokens. Padded
      keys and values are zeroed before the projection.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  _check_qkv(q, k, v)
  _check_mask(key_padding_mask, k.shape[0], k.shape[1])
  projected_k = project_sequence(k, e, key_padding_mask=key_padding_mask, name='E')
  projected_v = project_sequence(v, f, key_padding_mask=key_padding_mask, name='F')
  return attend(q, projected_k, projected_v)


def _to_windows(x: Array, mask: Optional[Array], max_len: int, window: int) -> Tuple[Array, Array]:
  """Pads x and its mask to max_len and splits the sequence into windows.

  Returns:
    x as [batch, max_len // window, window, heads, head_dim] and the mask as
    [batch, max_len // window, window].
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


def pool_sequence(
    x: Array, *, window: int, max_len: int, kind: str, key_padding_mask: Optional[Array] = None
) -> Tuple[Array, Array]:
  """Mean- or max-pools x along the sequence axis with kernel = stride = window.

  The input is treated as padded to max_len, so it always yields
  max_len // window positions. Padded positions never contribute: the mean is
  over real tokens only, the max ignores padding.

  Args:
    x: [batch, length, heads, head_dim].
    window: pooling window and stride (max_len / projected_len).
    max_len: the model's maximum sequence length n.
    kind: 'mean' or 'max'.
    key_padding_mask: optional [batch, length], True for real tokens.

  Returns:
    pooled [batch, max_len // window, heads, head_dim] in x's dtype and a
    [batch, max_len // window] mask, False for windows without real tokens.
  """
  windows, mask = _to_windows(x, key_padding_mask, max_len, window)
  windows = windows.astype(jnp.float32)
  real = mask[..., None, None]
  count = jnp.sum(mask, axis=2)
  if kind == 'mean':
    total = jnp.sum(jnp.where(real, windows, 0.0), axis=2)
    pooled = total / jnp.maximum(count, 1)[..., None, None]
  elif kind == 'max':
    pooled = jnp.max(jnp.where(real, windows, -jnp.inf), axis=2)
    pooled = jnp.where((count > 0)[..., None, None], pooled, 0.0)
  else:
    raise ValueError(f"Pooling kind must be 'mean' or 'max'; got {kind!r}.")
  return pooled.astype(x.dtype), count > 0


def conv_sequence(
    x: Array, kernel: Array, *, max_len: int, key_padding_mask: Optional[Array] = None
) -> Tuple[Array, Array]:
  """A strided convolution along the sequence, kernel size = stride = window.

  Each output position mixes one window of `window` consecutive positions and
  the head_dim features of each head: out[w] = sum_{j,c} x[w*window + j, c] K[j, c, :].
  Padded positions are zeroed, and windows with no real token are masked.

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
  windows, mask = _to_windows(zero_padding(x, key_padding_mask), key_padding_mask, max_len, window)
  equation = 'bwjhc,jcd->bwhd' if kernel.ndim == 3 else 'bwjhc,hjcd->bwhd'
  out = jnp.einsum(equation, windows.astype(jnp.float32), kernel.astype(jnp.float32))
  return out.astype(x.dtype), jnp.any(mask, axis=2)


def compress_sequence(
    x: Array,
    projection: str,
    weight: Optional[Array],
    *,
    max_len: int,
    projected_len: int,
    key_padding_mask: Optional[Array] = None,
    name: str = 'E',
) -> Tuple[Array, Optional[Array]]:
  """Compresses keys or values from length to projected_len positions.

  The paper's general projections, each blind to padding:
    'linear', 'random': x projected by a matrix `weight` (see project_sequence);
    'mean', 'max': pooling with kernel = stride = max_len / projected_len;
    'conv': strided convolution with kernel `weight` (see conv_sequence).

  Args:
    x: [batch, length, heads, head_dim].
    projection: one of 'linear', 'random', 'mean', 'max', 'conv'.
    weight: the projection matrix or convolution kernel (None for pooling).
    max_len: the model's maximum sequence length n.
    projected_len: the compressed length k.
    key_padding_mask: optional [batch, length], True for real tokens.
    name: the weight's name, used in error messages.

  Returns:
    compressed x [batch, projected_len, heads, head_dim] and a
    [batch, projected_len] mask of positions that hold real tokens (None when
    every compressed position does, as for a matrix projection).
  """
  if projection in ('linear', 'random'):
    return project_sequence(x, weight, key_padding_mask=key_padding_mask, name=name), None
  if projection in ('mean', 'max'):
    return pool_sequence(
        x,
        window=max_len // projected_len,
        max_len=max_len,
        kind=projection,
        key_padding_mask=key_padding_mask,
    )
  if projection == 'conv':
    return conv_sequence(x, weight, max_len=max_len, key_padding_mask=key_padding_mask)
  raise ValueError(
      f"projection={projection!r} is unknown; use 'linear', 'random', 'mean', 'max' or 'conv'."
  )


def compressed_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    projection: str,
    key_weight: Optional[Array],
    value_weight: Optional[Array],
    max_len: int,
    projected_len: int,
    key_padding_mask: Optional[Array] = None,
) -> Array:
  """Linformer attention with any of the paper's sequence projections.

  Keys and values are compressed by `compress_sequence` (with `key_weight` and
  `value_weight`, the E and F of the paper), then every query attends over the
  projected_len compressed positions.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  _check_qkv(q, k, v)
  _check_mask(key_padding_mask, k.shape[0], k.shape[1])
  common = dict(max_len=max_len, projected_len=projected_len, key_padding_mask=key_padding_mask)
  projected_k, projected_mask = compress_sequence(k, projection, key_weight, name='E', **common)
  projected_v, _ = compress_sequence(v, projection, value_weight, name='F', **common)
  return attend(q, projected_k, projected_v, projected_mask)
