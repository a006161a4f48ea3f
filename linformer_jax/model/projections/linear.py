"""'linear': the paper's learned projection matrices E and F.

Each is a [max_len, k] matrix (a leading heads axis for one per head),
initialised as `config.model.projection_init` says (`MATRIX_INITS`; '' is
'local', the default of configs/default.py) and trained:
  'jl'      the paper's Johnson-Lindenstrauss construction, entries N(0, 1/k)
  'local'   slot j the mean of its window of n / k adjacent positions, the
            windows of projection='mean' (block_len / k when causal), plus
            N(0, projection_init_noise^2) noise; k must divide the span, as
            for 'mean'. Padded rows are zeroed before E applies, as for every
            init, so a window holding padding gives the sum of its real
            tokens over the window's length (zero, and still attended, for
            a window of padding only), where 'mean' averages the real
            tokens and masks empty windows out
  'xavier'  Glorot uniform over the [n, k] matrix, U(-a, a) with
            a = sqrt(6 / (n + k)) (gain 1)
  'fairseq' the same with fairseq's gain 1/sqrt(2), a = sqrt(3 / (n + k)):
            entries of variance 1 / (n + k), so a slot of E^T x keeps about
            the norm of one row of x at every n, where 'jl' scales it by
            sqrt(n / k)
Each head's matrix of a per-head weight is drawn as one matrix. Keys and
values are projected by `attention.project_sequence`, with padded rows
zeroed first. Being linear, the projection commutes with the key/value dense
layers: a layer whose heads share E and F may compress its input first
(`compress_layer_input`).

Causal (block by block): rows i*b .. (i+1)*b - 1 of the matrix map block i
into its own r slots, a Linformer of its own per block.
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

# The `config.model.projection_init` values a [max_len, k] matrix takes.
MATRIX_INITS = ('jl', 'local', 'xavier', 'fairseq')


def johnson_lindenstrauss_init(projected_len: int):
  """Initialiser with entries from N(0, 1/k), the paper's JL construction."""
  return jax.nn.initializers.normal(stddev=projected_len**-0.5)


def local_window_init(span: int, noise: float):
  """Initialiser of a [(heads,) max_len, k] matrix whose slot j averages window j.

  The windows are `to_windows`' for window = span / k, those of
  projection='mean': without padding, E^T x is the mean pooling of x. A
  causal span (block_len) repeats its k slots in every block. Every head's
  matrix is the same before the noise, N(0, noise^2) per entry.
  """

  def init(key, shape, dtype=jnp.float32):
    max_len, projected_len = shape[-2:]
    window = span // projected_len
    positions = jnp.arange(max_len)[None, :, None, None]
    windows, _ = to_windows(positions, None, max_len, window)
    windows = windows[0, :, :, 0, 0]  # [max_len / window, window] positions
    # Window w of the sequence is slot w % k of its span.
    slots = jnp.arange(windows.shape[0])[:, None] % projected_len
    matrix = jnp.zeros((max_len, projected_len), dtype).at[windows, slots].set(1 / window)
    matrix = jnp.broadcast_to(matrix, shape)
    if noise:
      matrix = matrix + noise * jax.random.normal(key, shape, dtype)
    return matrix

  return init


def matrix_initializer(config, projected_len: int, per_head: bool):
  """The initialiser `config.projection_init` names for a [(heads,) n, k] matrix."""
  if config.projection_init == 'local':
    return local_window_init(config.compressed_span, config.projection_init_noise)
  if config.projection_init in ('xavier', 'fairseq'):
    # The heads axis is a batch of matrices, not part of any fan. Glorot's
    # variance is 2 / (fan_in + fan_out), times gain^2 = 1/2 for fairseq's.
    batch_axis = (0,) if per_head else ()
    scale = 1.0 if config.projection_init == 'xavier' else 0.5
    return jax.nn.initializers.variance_scaling(
        scale, 'fan_avg', 'uniform', in_axis=-2, out_axis=-1, batch_axis=batch_axis
    )
  return johnson_lindenstrauss_init(projected_len)


def compress_matrix_input(
    x: Array, weight: Array, *, key_padding_mask: Optional[Array] = None, name: str = 'E'
) -> Tuple[Array, Array]:
  """Projects a layer's input [batch, length, features] along the sequence.

  By linearity, E^T (m * (x W + b)) = (E^T (m * x)) W + (E^T m) b for a padding
  mask m, so keys and values can be projected from k compressed rows instead
  of n rows: the same result for fewer FLOPs.

  Args:
    x: [batch, length, features].
    weight: the matrix E (or F) shared by all heads, [max_len, k].
    key_padding_mask: optional [batch, length], True for real tokens.
    name: the weight's name, used in error messages.

  Returns:
    E^T (m * x) [batch, k, features] in x's dtype and the float32 [batch, k]
    factor E^T m that each compressed row's bias takes.
  """
  if weight is None or weight.ndim != 2:
    raise ValueError(
        f'Compressing a layer input takes a matrix shared by all heads; got weight shape '
        f"{getattr(weight, 'shape', None)}."
    )
  rows = attention.rows_for_length(weight, x.shape[1], name).astype(x.dtype)
  if key_padding_mask is None:
    real = jnp.ones(x.shape[:2], x.dtype)
  else:
    real = key_padding_mask.astype(x.dtype)
    x = jnp.where(key_padding_mask[:, :, None], x, jnp.zeros_like(x))
  compressed = precision.einsum('bnd,nk->bkd', x, rows)
  return compressed.astype(x.dtype), precision.einsum('bn,nk->bk', real, rows)


def block_diagonal_summaries(
    x: Array, weight: Array, *, block: int, slots: int, key_padding_mask: Array, name: str = 'E'
) -> Tuple[Array, Array]:
  """Block i of x projected by rows i*b .. (i+1)*b - 1 of the matrix.

  Args:
    x: [batch, num_blocks * block, heads, head_dim].
    weight: [max_len, slots] or [heads, max_len, slots].
    block, slots: b and r.
    key_padding_mask: [batch, num_blocks * block], True for real tokens.
    name: the weight's name, used in error messages.

  Returns:
    [batch, num_blocks * slots, heads, head_dim] and its mask, False for the
    slots of a block without real tokens.
  """
  batch, padded_len, heads, head_dim = x.shape
  num_blocks = padded_len // block
  rows = attention.rows_for_length(weight, padded_len, name)
  rows = rows.reshape(*weight.shape[:-2], num_blocks, block, slots)
  mask = key_padding_mask.reshape(batch, num_blocks, block)

  def project_block(block_x, block_rows, block_mask):
    return attention.project_sequence(block_x, block_rows, key_padding_mask=block_mask, name=name)

  summaries = jax.vmap(project_block, in_axes=(1, rows.ndim - 3, 1), out_axes=1)(
      x.reshape(batch, num_blocks, block, heads, head_dim), rows, mask
  )
  summaries = summaries.reshape(batch, num_blocks * slots, heads, head_dim)
  return summaries, jnp.repeat(jnp.any(mask, axis=-1), slots, axis=1)


@REGISTRY.register('linear')
class LearnedMatrix(SequenceProjectionKind):
  """Learned matrices E and F; see the module docstring."""

  compresses_first = True
  projection_inits = MATRIX_INITS
  mixes_positions_linearly = True

  @property
  def default_projection_init(self) -> str:
    # A local start, its updates centred (config.projection_remove_common_update),
    # leaves the unigram plateau at every n where 'jl' does not
    # (docs/results_gutenberg.md). A subclass that takes no 'local' keeps its first.
    return 'local' if 'local' in self.projection_inits else self.projection_inits[0]

  def weight(self, *, config, projected_len, per_head):
    heads = (config.num_heads,) if per_head else ()
    # Not axes.HEADS: projections stay replicated unless a rule names them.
    head_axes = (axes.PROJECTION_HEADS,) if per_head else ()
    return Parameter(
        shape=heads + (config.max_len, projected_len),
        init=matrix_initializer(config, projected_len, per_head),
        axes=head_axes + (axes.LENGTH, axes.PROJECTED_LENGTH),
    )

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del max_len, projected_len
    return attention.project_sequence(x, weight, key_padding_mask=key_padding_mask, name=name), None

  def compress_layer_input(
      self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'
  ):
    del max_len, projected_len
    compressed, bias_factor = compress_matrix_input(
        x, weight, key_padding_mask=key_padding_mask, name=name
    )
    return compressed, bias_factor, None

  def check_blocks(self, weight, block, slots):
    if weight is None or weight.ndim not in (2, 3):
      raise ValueError(f'projection={self.name!r} needs a weight [(heads,) max_len, slots].')
    if weight.shape[-1] != slots:
      raise ValueError(f"slots={slots} must equal the projection's last axis, {weight.shape[-1]}.")
    if weight.shape[-2] % block:
      raise ValueError(f"block={block} must divide max_len={weight.shape[-2]} (the weight's rows).")

  def block_summaries(self, x, weight, *, block, slots, key_padding_mask, name='E'):
    return block_diagonal_summaries(
        x, weight, block=block, slots=slots, key_padding_mask=key_padding_mask, name=name
    )

  def check_decode_len(self, weight, max_len):
    if weight.shape[-2] < max_len:
      raise ValueError(
          f'The projection covers {weight.shape[-2]} positions but the cache max_len is '
          f"{max_len}; build the cache with a max_len of at most the weight's rows."
      )

  def weight_for_block(self, weight, block_index, block):
    return jax.lax.dynamic_slice_in_dim(weight, block_index * block, block, axis=weight.ndim - 2)
