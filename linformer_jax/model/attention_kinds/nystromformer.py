"""'nystromformer': softmax attention through m landmarks, linear in n.

Xiong et al. (2021), "Nystromformer: A Nystrom-Based Algorithm for
Approximating Self-Attention": with landmark queries Q~ and keys K~, the means
of m segments of the queries and of the keys,

  out = softmax(Q K~^T / sqrt(d)) pinv(softmax(Q~ K~^T / sqrt(d))) softmax(Q~ K^T / sqrt(d)) V,

computed right to left: O(n m d + m^3) per head, no n x n matrix. m is
config.model.nystrom_landmarks. pinv is the paper's iterative Moore-Penrose
pseudo-inverse (`iterative_pinv`, PINV_ITERATIONS steps), started from
A^T / (max row sum * max column sum) of each example's and head's own m x m
matrix A, so that no example's output depends on another in its batch.

Segments: a row's real tokens (those its padding mask marks), in order, are
cut into m contiguous segments whose sizes differ by at most one (real token i
of R is in segment floor(i m / R)), so a length that m does not divide needs no
internal padding, and padding never enters a mean. A row of fewer than m real
tokens has one token per segment and its other segments empty: an empty
segment's landmark is masked out, no query weighs it and it weighs nothing.
Since the segments are cut from the real tokens alone, a row's output is the
same whatever padding follows its tokens or lies between them. A row with a
segment per real token (m >= R) has K~ = K and Q~ = Q: it is softmax attention,
up to the error of the pseudo-inverse.

Padded keys are masked from the softmaxes and padded values zeroed, so that
the content of padding never reaches a real token's output.

With config.model.nystrom_conv_kernel = w > 0, the paper's skip connection adds
a depthwise convolution of V along the sequence, each head's w taps shared by
its head_dim features (a `Parameter` 'value_conv' [w, heads] of each layer),
centred, zero beyond the sequence's ends and at padded positions.

The landmarks mix every query, so `attend` always receives the whole sequence
(`queries_independent` False); it cuts the segments from the key mask and
reads m from the config bound to the kind (`AttentionKind.with_config`).
Softmaxes and the pseudo-inverse are float32; the products with n rows take the
inputs' dtype and accumulate in float32 (`precision.einsum`). There is no
causal form: a segment mean would mix later tokens into every query.
"""

import functools
import math
from typing import NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import logical_axes
from linformer_jax.model import precision
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.attention_kinds.base import Parameter
from linformer_jax.registry import Setting

Array = jax.Array

# Steps of the iterative pseudo-inverse, as in the paper.
PINV_ITERATIONS = 6

# The m x m products of the pseudo-inverse are tiny and compound over the
# steps: full float32, where an accelerator's default would round to bfloat16.
_exact_matmul = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)


def segment_membership(padding_mask: Optional[Array], length: int, landmarks: int) -> Array:
  """Which of `landmarks` segments each real token is in; see the module docstring.

  Args:
    padding_mask: optional bool [batch, length], True for real tokens.
    length: the sequence length (for a mask of None).
    landmarks: m.

  Returns:
    bool [batch, length, landmarks]: one True per real token, none for padding.
  """
  real = jnp.ones((1, length), bool) if padding_mask is None else padding_mask
  real_index = jnp.cumsum(real, axis=1) - 1  # the token's index among the row's real ones
  real_count = jnp.maximum(jnp.sum(real, axis=1, keepdims=True), 1)
  segment = real_index * landmarks // real_count
  return real[..., None] & (segment[..., None] == jnp.arange(landmarks))


def landmark_means(x: Array, membership: Array) -> Array:
  """The mean of each segment of x [batch, length, heads, head_dim]: float32
  [batch, landmarks, heads, head_dim], zero for an empty segment."""
  real = jnp.any(membership, axis=-1)[:, :, None, None]
  # 0/1 weights are exact in any dtype; the division by the count is float32.
  sums = precision.einsum(
      'bnl,bnhd->blhd', membership.astype(x.dtype), jnp.where(real, x, jnp.zeros_like(x))
  )
  counts = jnp.sum(membership, axis=1, dtype=jnp.float32)  # [batch, landmarks]
  return sums / jnp.maximum(counts, 1.0)[:, :, None, None]


def _masked_softmax(logits: Array, allowed: Array) -> Array:
  return jax.nn.softmax(jnp.where(allowed, logits, attention.MASKED_LOGIT), axis=-1)


def iterative_pinv(matrix: Array, iterations: int = PINV_ITERATIONS) -> Array:
  """The Moore-Penrose pseudo-inverse of [..., m, m] matrices, iteratively.

  Z_0 = A^T / (max row sum of |A| * max column sum of |A|), then
  Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4, the paper's
  iteration (from Razavi et al., 2014). Rows and columns of A that are zero
  stay zero in Z. A zero matrix gives a zero Z.

  Args:
    matrix: float32 [..., m, m].
    iterations: the steps after Z_0.

  Returns:
    float32 [..., m, m].
  """
  magnitudes = jnp.abs(matrix)
  max_row_sum = jnp.max(jnp.sum(magnitudes, axis=-1), axis=-1)
  max_column_sum = jnp.max(jnp.sum(magnitudes, axis=-2), axis=-1)
  scale = (max_row_sum * max_column_sum)[..., None, None]
  z = jnp.swapaxes(matrix, -1, -2) / jnp.where(scale > 0, scale, 1.0)
  identity = jnp.eye(matrix.shape[-1], dtype=matrix.dtype)

  def step(_, z):
    az = _exact_matmul(matrix, z)
    inner = _exact_matmul(az, 7 * identity - az)
    return 0.25 * _exact_matmul(z, 13 * identity - _exact_matmul(az, 15 * identity - inner))

  # A loop, not unrolled: one step to compile (a scan, so gradients flow through it).
  z = jax.lax.fori_loop(0, iterations, step, z)
  return z


def value_convolution(values: Array, kernel: Array) -> Array:
  """The depthwise skip connection: out[t] = sum_s kernel[s, h] v[t + s - (w - 1) // 2].

  Args:
    values: [batch, length, heads, head_dim], padded rows zero.
    kernel: [w, heads], each head's taps, shared by its head_dim features.

  Returns:
    float32 [batch, length, heads, head_dim]; positions beyond the ends count as zero.
  """
  batch, length, heads, head_dim = values.shape
  width = kernel.shape[0]
  channels = heads * head_dim
  # Channel h * head_dim + i takes head h's taps.
  taps = jnp.repeat(kernel, head_dim, axis=1)[:, None, :].astype(values.dtype)
  out = jax.lax.conv_general_dilated(
      values.reshape(batch, length, channels),
      taps,
      window_strides=(1,),
      padding=[((width - 1) // 2, width // 2)],
      dimension_numbers=('NWC', 'WIO', 'NWC'),
      feature_group_count=channels,
      preferred_element_type=jnp.float32,
  )
  return out.reshape(batch, length, heads, head_dim)


class LandmarkFactors(NamedTuple):
  """The three factors of Nystrom attention, float32, [batch, heads, ...].

  Attributes:
    to_landmarks: [n, m], softmax(Q K~^T / sqrt(d)), every query over the
      landmark keys.
    inverse: [m, m], pinv(softmax(Q~ K~^T / sqrt(d))), an empty landmark's
      row and column zero.
    from_landmarks: [m, n], softmax(Q~ K^T / sqrt(d)), each landmark query
      over the real keys.
  """

  to_landmarks: Array
  inverse: Array
  from_landmarks: Array


def landmark_factors(
    q: Array, k: Array, membership: Array, *, iterations: int = PINV_ITERATIONS
) -> LandmarkFactors:
  """The factors of Nystrom attention over landmarks of given segments.

  Args:
    q, k: [batch, length, heads, head_dim], one sequence's queries and keys.
    membership: bool [batch, length, landmarks] (`segment_membership`); its
      tokens in no segment are padding.
    iterations: steps of the pseudo-inverse.
  """
  if membership.shape[:2] != q.shape[:2] or q.shape[1] != k.shape[1]:
    raise ValueError(
        f'membership must be [batch, length, landmarks] for queries and keys of shapes '
        f'{q.shape} and {k.shape}; got {membership.shape}.'
    )
  scale = 1.0 / math.sqrt(q.shape[-1])
  real = jnp.any(membership, axis=-1)  # [batch, length]
  landmark_real = jnp.any(membership, axis=1)  # [batch, landmarks]
  q_landmarks, k_landmarks = landmark_means(q, membership), landmark_means(k, membership)

  # softmax(Q K~^T): every query over the landmark keys, [batch, heads, n, m].
  logits = precision.einsum('bnhd,blhd->bhnl', q, k_landmarks.astype(q.dtype)) * scale
  to_landmarks = _masked_softmax(logits, landmark_real[:, None, None, :])
  # softmax(Q~ K~^T), [batch, heads, m, m], in float32: the matrix pinv inverts.
  # An empty landmark's row is zeroed, so that pinv ignores it.
  logits = jnp.einsum(
      'blhd,bmhd->bhlm', q_landmarks, k_landmarks, precision=jax.lax.Precision.HIGHEST
  )
  between = _masked_softmax(logits * scale, landmark_real[:, None, None, :])
  between = jnp.where(landmark_real[:, None, :, None], between, 0.0)
  # softmax(Q~ K^T): each landmark query over the real keys, [batch, heads, m, n].
  logits = precision.einsum('blhd,bnhd->bhln', q_landmarks.astype(k.dtype), k) * scale
  from_landmarks = _masked_softmax(logits, real[:, None, None, :])
  return LandmarkFactors(to_landmarks, iterative_pinv(between, iterations), from_landmarks)


def landmark_attention(
    q: Array,
    k: Array,
    v: Array,
    membership: Array,
    value_conv: Optional[Array] = None,
    *,
    iterations: int = PINV_ITERATIONS,
) -> Array:
  """Nystrom attention over landmarks of given segments; see the module docstring.

  Args:
    q, k, v: [batch, length, heads, head_dim], one sequence's queries, keys
      and values (positions aligned).
    membership: bool [batch, length, landmarks] (`segment_membership`); its
      tokens in no segment are padding.
    value_conv: optional [w, heads], the skip connection's taps.
    iterations: steps of the pseudo-inverse.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  attention.check_qkv(q, k, v)
  factors = landmark_factors(q, k, membership, iterations=iterations)
  real = jnp.any(membership, axis=-1)  # [batch, length]
  values = jnp.where(real[:, :, None, None], v, jnp.zeros_like(v))
  landmark_values = precision.einsum(
      'bhln,bnhd->bhld', factors.from_landmarks.astype(v.dtype), values
  )
  mixed = _exact_matmul(factors.inverse, landmark_values)
  out = precision.einsum(
      'bhnl,bhld->bnhd', factors.to_landmarks.astype(v.dtype), mixed.astype(v.dtype)
  )
  if value_conv is not None:
    out = out + value_convolution(values, value_conv)
  return out.astype(q.dtype)


def convolution_matrix(kernel: Array, length: int) -> Array:
  """`value_convolution` as a matrix: float32 [heads, length, length], entry
  [h, t, s] the weight of v[s] in out[t] (kernel[s - t + (w - 1) // 2, h])."""
  width = kernel.shape[0]
  positions = jnp.arange(length)
  tap = positions[None, :] - positions[:, None] + (width - 1) // 2  # [t, s]
  inside = (tap >= 0) & (tap < width)
  taps = jnp.swapaxes(kernel, 0, 1).astype(jnp.float32)[:, jnp.clip(tap, 0, width - 1)]
  return jnp.where(inside[None], taps, 0.0)


def nystrom_attention(
    q: Array,
    k: Array,
    v: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    landmarks: int,
    value_conv: Optional[Array] = None,
    iterations: int = PINV_ITERATIONS,
) -> Array:
  """Nystrom attention of a sequence; see the module docstring.

  Args:
    q, k, v: [batch, length, heads, head_dim] (positions aligned).
    key_padding_mask: optional [batch, length], True for real tokens.
    landmarks: m, the number of segments.
    value_conv: optional [w, heads], the skip connection's taps.
    iterations: steps of the pseudo-inverse.

  Returns:
    [batch, length, heads, head_dim] in the dtype of `q`.
  """
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  membership = segment_membership(key_padding_mask, k.shape[1], landmarks)
  membership = jnp.broadcast_to(membership, (k.shape[0],) + membership.shape[1:])
  return landmark_attention(q, k, v, membership, value_conv, iterations=iterations)


def nystrom_weights(
    q: Array,
    k: Array,
    key_padding_mask: Optional[Array] = None,
    *,
    landmarks: int,
    value_conv: Optional[Array] = None,
    iterations: int = PINV_ITERATIONS,
) -> Array:
  """The matrix `nystrom_attention` applies to the values, for analyses: the
  product of its three factors, plus the skip connection's band when
  `value_conv` is given; padded keys' columns zero.

  Returns:
    float32 [batch, heads, length, length].
  """
  attention.check_mask(key_padding_mask, k.shape[0], k.shape[1])
  membership = segment_membership(key_padding_mask, k.shape[1], landmarks)
  membership = jnp.broadcast_to(membership, (k.shape[0],) + membership.shape[1:])
  factors = landmark_factors(q, k, membership, iterations=iterations)
  weights = _exact_matmul(
      _exact_matmul(factors.to_landmarks, factors.inverse), factors.from_landmarks
  )
  if value_conv is not None:
    real = jnp.any(membership, axis=-1)  # [batch, length]
    band = convolution_matrix(value_conv, k.shape[1])[None]
    weights = weights + jnp.where(real[:, None, None, :], band, 0.0)
  return weights


@REGISTRY.register('nystromformer')
class Nystromformer(AttentionKind):
  """Softmax attention through segment-mean landmarks; see the module docstring."""

  uses_kernel = False  # its own three softmaxes, no kernel's
  drops_attention_weights = False  # three softmaxes and a pseudo-inverse, no one P to drop
  queries_independent = False  # the landmark queries are means over every query
  supports_causal = False

  settings = (
      Setting(
          'nystrom_landmarks',
          int,
          64,
          minimum=1,
          allowed='use a positive integer (the number m of landmarks)',
          help_text='m, the segment-mean landmarks',
      ),
      Setting(
          'nystrom_conv_kernel',
          int,
          0,
          minimum=0,
          allowed='use 0 (no convolution of V) or a positive width, e.g. 33 as the paper',
          help_text='width of the depthwise convolution of V added to the output (0 = none)',
      ),
  )

  def parameters(self, config):
    width = config.setting('nystrom_conv_kernel')
    if not width:
      return {}
    # PyTorch's default convolution init (uniform, bound 1 / sqrt(w)), which the paper's code uses.
    init = nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform', in_axis=0, out_axis=1)
    return {
        'value_conv': Parameter(
            shape=(width, config.num_heads),
            init=init,
            axes=(logical_axes.CONV_WINDOW, logical_axes.HEADS),
        )
    }

  def _config(self):
    if self.config is None:
      raise ValueError(
          f'attention={self.name!r}: attend reads nystrom_landmarks from the model config; '
          'bind one with with_config(config) (layers.SelfAttention does) before calling it.'
      )
    return self.config

  def attend(self, q, keys, values, key_mask, *, kernel):
    del kernel  # its own three softmaxes, no kernel computes this
    return nystrom_attention(
        q,
        keys,
        values,
        key_mask,
        landmarks=self._config().setting('nystrom_landmarks'),
        value_conv=self.params.get('value_conv'),
    )

  def attention_weights(self, q, keys, values, key_mask):
    del values  # P does not depend on them
    return nystrom_weights(
        q,
        keys,
        key_mask,
        landmarks=self._config().setting('nystrom_landmarks'),
        value_conv=self.params.get('value_conv'),
    )
