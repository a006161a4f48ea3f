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

This module holds what every kind of attention shares: the softmax attention
itself and the paper's matrix projection. The other sequence projections live
in `linformer_jax.model.projections`, one module each, and the attention kinds
(full, Linformer, causal Linformer) in `linformer_jax.model.attention_kinds`.

Matrix products take the inputs' dtype (bfloat16 under model.dtype='bfloat16')
and accumulate in float32 (`precision.einsum`); the softmax runs in float32;
outputs come back in the input dtype.
"""

import functools
import math
from typing import Callable, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from linformer_jax.model import precision

Array = jax.Array

# Logit given to masked keys. Finite (not -inf) so that a row whose keys are all
# masked yields a uniform distribution instead of NaNs.
MASKED_LOGIT = -1e30


def check_qkv(q: Array, k: Array, v: Array) -> None:
  """Raises a ValueError unless q, k, v are [batch, length, heads, head_dim] that agree."""
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


def check_mask(mask: Optional[Array], batch: int, length: int) -> None:
  """Raises a ValueError unless the padding mask is None or [batch, length]."""
  if mask is not None and mask.shape != (batch, length):
    raise ValueError(
        f'key_padding_mask must be [batch, length] = {(batch, length)}; got {mask.shape}.'
    )


class WeightDropout(NamedTuple):
  """Dropout on the attention weights P (RoBERTa's `attention_dropout`).

  Each weight is zeroed with probability `rate` and the rest scaled by
  1 / (1 - rate), after the softmax and before the product with the values;
  for a Linformer that is the [n, k] matrix, for the Transformer [n, n].

  Attributes:
    rate: the probability of dropping a weight, in (0, 1).
    key: a PRNG key for this pass and layer.
  """

  rate: float
  key: Array

  def fold(self, salt) -> 'WeightDropout':
    """The same rate with a key of its own for one part of a pass (a block,
    say): `salt` is an int, or a traced integer under vmap or scan."""
    return WeightDropout(self.rate, jax.random.fold_in(self.key, salt))

  def apply(self, weights: Array) -> Array:
    """`weights` with the dropout applied, in their dtype."""
    keep = jax.random.bernoulli(self.key, 1.0 - self.rate, weights.shape)
    return jnp.where(keep, weights / (1.0 - self.rate), 0.0).astype(weights.dtype)


def drop_weights(weights: Array, dropout: Optional[WeightDropout]) -> Array:
  """`dropout.apply(weights)`, or the weights unchanged when dropout is None."""
  return weights if dropout is None else dropout.apply(weights)


def attend(
    q: Array,
    k: Array,
    v: Array,
    key_mask: Optional[Array] = None,
    dropout: Optional[WeightDropout] = None,
) -> Array:
  """Softmax attention of every query over the given keys/values.

  Args:
    q: [batch, q_length, heads, head_dim] queries.
    k: [batch, kv_length, heads, head_dim] keys (possibly compressed).
    v: [batch, kv_length, heads, head_dim] values (possibly compressed).
    key_mask: optional boolean, True for keys that may be attended to:
      [batch, kv_length] for every query alike, or [batch, q_length,
      kv_length] per query (a causal mask).
    dropout: dropout on the attention weights (training), or None.

  Returns:
    [batch, q_length, heads, head_dim] in the dtype of `q`.
  """
  head_dim = q.shape[-1]
  logits = precision.einsum('bqhd,bkhd->bhqk', q, k.astype(q.dtype))
  logits = logits / jnp.sqrt(jnp.float32(head_dim))
  if key_mask is not None:
    mask = key_mask[:, None, None, :] if key_mask.ndim == 2 else key_mask[:, None]
    logits = jnp.where(mask, logits, MASKED_LOGIT)
  weights = drop_weights(jax.nn.softmax(logits, axis=-1), dropout)
  # The probabilities round to v's dtype for the product (as a bfloat16 flash
  # attention kernel does); the sum over keys accumulates in float32.
  out = precision.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return out.astype(q.dtype)


# How `attend_with` computes softmax attention: this module's einsums,
# jax.nn.dot_product_attention with its XLA or cuDNN (flash attention, GPU)
# implementation, or JAX's Pallas flash attention kernel for TPUs. 'auto' is a
# choice, not a kernel: `kernel_for_platform` turns it into one of the others
# for the devices a step is compiled for.
ATTENTION_KERNELS = ('einsum', 'xla', 'cudnn', 'pallas')
AUTO_KERNEL = 'auto'
KERNEL_CHOICES = (AUTO_KERNEL,) + ATTENTION_KERNELS

# What cuDNN's fused attention takes (jax.nn.dot_product_attention's checks).
CUDNN_DTYPES = ('bfloat16', 'float16')
CUDNN_MAX_HEAD_DIM = 128  # and a multiple of 8


def cudnn_refusal(dtype: str, head_dim: int) -> Optional[str]:
  """Why cuDNN's fused attention cannot take these inputs, or None if it can."""
  if dtype not in CUDNN_DTYPES:
    return f'cuDNN attention takes 16-bit inputs, not {dtype} (set model.dtype=bfloat16)'
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return (
        f'cuDNN attention takes a head width that is a multiple of 8 and at most '
        f'{CUDNN_MAX_HEAD_DIM}, not {head_dim}'
    )
  return None


PALLAS_BLOCK = 128  # the TPU kernel's lengths (queries and keys) are multiples of this


def pallas_refusal(lengths: Sequence[int]) -> Optional[str]:
  """Why the Pallas TPU kernel cannot take sequences of these lengths, or None."""
  odd = sorted({length for length in lengths if length % PALLAS_BLOCK})
  if odd:
    return (
        f'the Pallas TPU kernel takes query and key lengths that are multiples of '
        f'{PALLAS_BLOCK}, not {", ".join(map(str, odd))}'
    )
  return None


def kernel_for_platform(
    requested: str,
    platform: str,
    *,
    dtype: str,
    head_dim: int,
    lengths: Sequence[int] = (),
    attention_dropout: float = 0.0,
) -> tuple[str, str]:
  """(kernel, why) for a step compiled for devices of `platform`.

  'auto' takes cuDNN's fused attention on GPUs where the dtype and head width
  allow it, the Pallas flash attention kernel on TPUs, and the einsums
  elsewhere (CPUs, float32 on a GPU). `lengths` are the query and key
  lengths the model attends over (max_len, and k for a Linformer). Only the
  einsums drop out attention weights (`WeightDropout`): with
  `attention_dropout` > 0, 'auto' is einsum everywhere. An explicit kernel is
  kept; one that cannot run raises ValueError naming what to set instead.
  """
  if requested not in KERNEL_CHOICES:
    raise ValueError(f'attention kernel {requested!r} is unknown; use one of {KERNEL_CHOICES}.')
  on_gpu = platform in ('gpu', 'cuda')
  no_dropout = (
      f'only the einsums drop out attention weights (model.attention_dropout_rate='
      f'{attention_dropout}; 0.0 lets a fused kernel run)'
  )
  if requested == AUTO_KERNEL:
    if platform == 'tpu':
      refusal = pallas_refusal(lengths) or (attention_dropout > 0 and no_dropout)
      if refusal:
        return 'einsum', f'auto: einsum on tpu, since {refusal}'
      return 'pallas', 'auto: Pallas flash attention on tpu'
    if not on_gpu:
      return 'einsum', f'auto: einsum on {platform}'
    refusal = cudnn_refusal(dtype, head_dim) or (attention_dropout > 0 and no_dropout)
    if refusal:
      return 'einsum', f'auto: einsum on gpu, since {refusal}'
    return 'cudnn', 'auto: cuDNN fused attention on gpu'
  if requested == 'cudnn':
    if not on_gpu:
      raise ValueError(
          f"model.attention_kernel='cudnn' runs on NVIDIA GPUs, and this step is compiled for "
          f"{platform}; use 'auto' or 'einsum'."
      )
    refusal = cudnn_refusal(dtype, head_dim)
    if refusal:
      raise ValueError(f"model.attention_kernel='cudnn': {refusal}; or use 'auto'.")
  if requested == 'pallas':
    if platform != 'tpu':
      raise ValueError(
          f"model.attention_kernel='pallas' runs on TPUs, and this step is compiled for "
          f"{platform}; use 'auto' or 'einsum'."
      )
    refusal = pallas_refusal(lengths)
    if refusal:
      raise ValueError(f"model.attention_kernel='pallas': {refusal}; or use 'auto'.")
  if attention_dropout > 0 and requested != 'einsum':
    raise ValueError(
        f'model.attention_kernel={requested!r} takes no dropout on the attention weights, '
        f'and model.attention_dropout_rate={attention_dropout}; set the rate to 0.0 to use '
        "the kernel, or use attention_kernel='auto' or 'einsum'."
    )
  return requested, 'as configured'


# The kernels XLA cannot split over a mesh by itself (a Mosaic kernel cannot be
# partitioned at all; cuDNN's partitions by rules of its own): on a mesh of more
# than one device they run inside a shard_map, one call per device.
FUSED_KERNELS = ('cudnn', 'pallas')


class MeshPartition(NamedTuple):
  """How attention's [batch, length, heads, head_dim] arrays split over a mesh.

  A fused kernel runs inside `jax.shard_map` over `mesh`: each device attends
  over its own rows of the batch and its own heads, which is all attention
  needs (no head or batch row reads another). The sequence axis is never
  split, so a Linformer's compression E K, outside the kernel, partitions as
  XLA chooses and the kernel reads the k compressed rows whole.

  Attributes:
    mesh: the run's device mesh.
    batch_axes: the mesh axes that split the batch (config.axis_rules' 'batch').
    heads_axes: the mesh axes that split the heads ('heads').
  """

  mesh: jax.sharding.Mesh
  batch_axes: Tuple[str, ...] = ()
  heads_axes: Tuple[str, ...] = ()

  def ways(self, axes: Tuple[str, ...]) -> int:
    """Into how many parts `axes` of the mesh split a dimension."""
    return math.prod(self.mesh.shape[axis] for axis in axes)

  def refusal(self, batch: int, heads: int) -> Optional[str]:
    """Why inputs of this batch and head count cannot split over the mesh, or None."""
    for what, size, axes in (
        ('batch', batch, self.batch_axes),
        ('head count', heads, self.heads_axes),
    ):
      if size % self.ways(axes):
        return (
            f'a {what} of {size} does not divide over the {self.ways(axes)}-way mesh axis {axes[0]}'
        )
    return None

  def run(
      self, fused: Callable[..., Array], q: Array, k: Array, v: Array, key_mask: Optional[Array]
  ) -> Array:
    """`fused(q, k, v, key_mask)` on each device's slice of the batch and heads."""
    batch = self.batch_axes or None
    rows = jax.sharding.PartitionSpec(batch, None, self.heads_axes or None, None)
    mask = jax.sharding.PartitionSpec(batch, None)
    if key_mask is None:
      per_device = lambda q, k, v: fused(q, k, v, None)
      in_specs, args = (rows, rows, rows), (q, k, v)
    else:
      per_device, in_specs, args = fused, (rows, rows, rows, mask), (q, k, v, key_mask)
    # check_vma=False: a pallas_call does not declare how its outputs vary over the mesh.
    split = jax.shard_map(
        per_device, mesh=self.mesh, in_specs=in_specs, out_specs=rows, check_vma=False
    )
    return split(*args)


class PartitionedKernel(NamedTuple):
  """A fused kernel (`FUSED_KERNELS`) and the mesh it runs over, per device.

  What `ModelConfig.kernel` hands the attention kinds for a run on a mesh of
  more than one device; `attend_with` takes it wherever it takes a kernel name.
  """

  name: str
  partition: MeshPartition


def attend_with(
    kernel: Union[str, PartitionedKernel],
    q: Array,
    k: Array,
    v: Array,
    key_mask: Optional[Array] = None,
    dropout: Optional[WeightDropout] = None,
) -> Array:
  """`attend` by the chosen kernel; key_mask is [batch, kv_length] or None.

  `dropout` on the attention weights runs in the einsums only
  (`kernel_for_platform` chooses them for a run that drops weights out); any
  other kernel with a dropout raises ValueError.

  A `PartitionedKernel` runs inside a shard_map over its mesh; a call whose
  batch or heads do not divide over the mesh (a generation batch of one, a
  micro-batch smaller than the data axis) attends by the einsums instead,
  which XLA partitions by itself, as does an input shorter than the Pallas
  kernel's block.

  cuDNN's kernel takes a padding mask as the number of keys per row (a
  boolean mask would be a [q_length, kv_length] bias, the memory the kernel
  exists to save): each row's padding must come after its real tokens, as
  this project's data pipelines lay it out.
  """
  partition = None
  if isinstance(kernel, PartitionedKernel):
    kernel, partition = kernel.name, kernel.partition
  if kernel == AUTO_KERNEL:  # a model built outside a run: by JAX's default backend
    kernel, _ = kernel_for_platform(
        kernel,
        jax.default_backend(),
        dtype=jnp.dtype(q.dtype).name,
        head_dim=q.shape[-1],
        attention_dropout=0.0 if dropout is None else dropout.rate,
    )
  if kernel not in ATTENTION_KERNELS:
    raise ValueError(f'attention kernel {kernel!r} is unknown; use one of {ATTENTION_KERNELS}.')
  if kernel == 'einsum':
    return attend(q, k, v, key_mask, dropout)
  if dropout is not None:
    raise ValueError(
        f'attention kernel {kernel!r} takes no dropout on the attention weights; use '
        "'einsum', or set model.attention_dropout_rate=0.0."
    )
  if kernel == 'pallas' and pallas_refusal((q.shape[1], k.shape[1])):
    return attend(q, k, v, key_mask)  # a shorter input than the model's n
  fused = tpu_flash_attention if kernel == 'pallas' else functools.partial(_jax_attention, kernel)
  if partition is None or kernel not in FUSED_KERNELS:
    return fused(q, k, v, key_mask)
  if partition.refusal(q.shape[0], q.shape[2]):
    return attend(q, k, v, key_mask)
  return partition.run(fused, q, k, v, key_mask)


def _jax_attention(
    kernel: str, q: Array, k: Array, v: Array, key_mask: Optional[Array] = None
) -> Array:
  """`attend` by jax.nn.dot_product_attention's implementation `kernel`."""
  if kernel == 'cudnn' and key_mask is not None:
    lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        query_seq_lengths=jnp.full_like(lengths, q.shape[1]),
        key_value_seq_lengths=lengths,
        implementation=kernel,
    )
    return out.astype(q.dtype)
  mask = None if key_mask is None else key_mask[:, None, None, :]
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=kernel)
  return out.astype(q.dtype)


def _block(length: int) -> int:
  """A block of the Pallas kernel along a sequence: the largest of 512, 256
  and 128 that divides it, else the whole sequence."""
  return next((block for block in (512, 256, 128) if length % block == 0), length)


def tpu_flash_attention(q: Array, k: Array, v: Array, key_mask: Optional[Array] = None) -> Array:
  """`attend` through JAX's Pallas flash attention kernel for TPUs: the
  [q_length, kv_length] probabilities are never stored, forward or backward.

  Query and key lengths are multiples of `PALLAS_BLOCK` (`pallas_refusal`).
  A padding mask [batch, kv_length] goes in as segment ids: every query is in
  segment 1 and a padded key in segment 0, so it gets no weight. On a CPU the
  kernel runs under `pltpu.force_tpu_interpret_mode()` (the tests).
  """
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

  batch, q_length, _, head_dim = q.shape
  kv_length = k.shape[1]
  segment_ids = None
  if key_mask is not None:
    segment_ids = pallas_flash.SegmentIds(
        q=jnp.ones((batch, q_length), jnp.int32), kv=key_mask.astype(jnp.int32)
    )
  block_q, block_k = _block(q_length), _block(kv_length)
  blocks = pallas_flash.BlockSizes(
      block_q=block_q,
      block_k_major=block_k,
      block_k=block_k,
      block_b=1,
      block_q_major_dkv=block_q,
      block_k_major_dkv=block_k,
      block_k_dkv=block_k,
      block_q_dkv=block_q,
      block_k_major_dq=block_k,
      block_k_dq=block_k,
      block_q_dq=block_q,
  )
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [batch, heads, length, head_dim]
  out = pallas_flash.flash_attention(
      heads_first(q),
      heads_first(k.astype(q.dtype)),
      heads_first(v.astype(q.dtype)),
      segment_ids=segment_ids,
      sm_scale=float(1.0 / np.sqrt(head_dim)),
      block_sizes=blocks,
  )
  return heads_first(out).astype(q.dtype)


def dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    key_padding_mask: Optional[Array] = None,
    causal: bool = False,
    dropout: Optional[WeightDropout] = None,
) -> Array:
  """Standard softmax attention, the Transformer baseline: softmax(QK^T/sqrt(d))V.

  Args:
    q, k, v: [batch, length, heads, head_dim].
    key_padding_mask: optional [batch, length], True for real tokens; padded
      keys get zero attention weight.
    causal: position t attends to positions <= t only (a language model's
      mask).
    dropout: dropout on the attention weights (training), or None.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  check_qkv(q, k, v)
  check_mask(key_padding_mask, k.shape[0], k.shape[1])
  if not causal:
    return attend(q, k, v, key_padding_mask, dropout)
  batch, length = k.shape[:2]
  mask = jnp.tril(jnp.ones((length, length), bool))[None]
  if key_padding_mask is not None:
    # Every position also sees itself, so no row is empty (an empty row would
    # spread its weight over every key, later ones included).
    mask = mask & (key_padding_mask[:, None, :] | jnp.eye(length, dtype=bool)[None])
  return attend(q, k, v, jnp.broadcast_to(mask, (batch, length, length)), dropout)


def zero_padding(x: Array, key_padding_mask: Optional[Array]) -> Array:
  """Zeroes the padded rows of x [batch, length, heads, head_dim]."""
  if key_padding_mask is None:
    return x
  return jnp.where(key_padding_mask[:, :, None, None], x, jnp.zeros_like(x))


def rows_for_length(matrix: Array, length: int, name: str) -> Array:
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
  rows = rows_for_length(matrix, x.shape[1], name)
  x = zero_padding(x, key_padding_mask)
  equation = 'bnhd,nk->bkhd' if rows.ndim == 2 else 'bnhd,hnk->bkhd'
  # The sum runs over up to max_len positions: it accumulates in float32.
  out = precision.einsum(equation, x, rows.astype(x.dtype))
  return out.astype(x.dtype)


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
  check_qkv(q, k, v)
  check_mask(key_padding_mask, k.shape[0], k.shape[1])
  projected_k = project_sequence(k, e, key_padding_mask=key_padding_mask, name='E')
  projected_v = project_sequence(v, f, key_padding_mask=key_padding_mask, name='F')
  return attend(q, projected_k, projected_v)
