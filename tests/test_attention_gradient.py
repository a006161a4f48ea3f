"""The gradient of `attention.attend` (JAX's autodiff through the masked softmax)
against float64 central differences of the naive reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.model import attention
from tests.test_attention import naive_attention

# Small enough for finite differences over every input element.
BATCH, Q_LENGTH, KV_LENGTH, HEADS, HEAD_DIM = 2, 5, 4, 2, 3


def inputs(seed, dtype=jnp.float32):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(keys[0], (BATCH, Q_LENGTH, HEADS, HEAD_DIM))
  k, v = (jax.random.normal(key, (BATCH, KV_LENGTH, HEADS, HEAD_DIM)) for key in keys[1:3])
  weights = jax.random.normal(keys[3], (BATCH, Q_LENGTH, HEADS, HEAD_DIM))
  return tuple(a.astype(dtype) for a in (q, k, v)), weights


def masks():
  """None, a key padding mask [b, k] and a per-query mask [b, q, k] (no empty row)."""
  padding = jnp.asarray([[True] * KV_LENGTH, [True, True, False, False]])
  per_query = jnp.tril(jnp.ones((Q_LENGTH, KV_LENGTH), bool), k=1)[None] & padding[:, None, :]
  return {'none': None, 'padding': padding, 'per_query': per_query}


def finite_difference_gradients(qkv, weights, mask, step=1e-6):
  """d sum(attention * weights) / d q, k, v by central differences in float64."""
  arrays = [np.asarray(a, np.float64) for a in qkv]
  weights = np.asarray(weights, np.float64)

  def loss(args):
    if mask is None or mask.ndim == 2:
      return np.sum(naive_attention(*args, mask) * weights)
    # naive_attention takes [b, k]; a per-query mask goes query by query.
    out = np.stack(
        [naive_attention(args[0][:, i : i + 1], *args[1:], mask[:, i]) for i in range(Q_LENGTH)],
        axis=1,
    )[:, :, 0]
    return np.sum(out * weights)

  gradients = []
  for index in range(3):
    gradient = np.zeros_like(arrays[index])
    for position in np.ndindex(gradient.shape):
      shifted = [a.copy() for a in arrays]
      shifted[index][position] += step
      up = loss(shifted)
      shifted[index][position] -= 2 * step
      gradient[position] = (up - loss(shifted)) / (2 * step)
    gradients.append(gradient)
  return gradients


def gradients_of(attend_fn, qkv, weights, mask):
  loss = lambda q, k, v: jnp.sum(attend_fn(q, k, v, mask).astype(jnp.float32) * weights)
  return jax.grad(loss, argnums=(0, 1, 2))(*qkv)


@pytest.mark.parametrize('mask_name', ['none', 'padding', 'per_query'])
def test_gradient_matches_float64_finite_differences(mask_name):
  qkv, weights = inputs(0)
  mask = masks()[mask_name]
  expected = finite_difference_gradients(qkv, weights, None if mask is None else np.asarray(mask))
  for name, actual, wanted in zip(
      'qkv', gradients_of(attention.attend, qkv, weights, mask), expected
  ):
    error = np.abs(np.asarray(actual, np.float64) - wanted).max() / np.abs(wanted).max()
    assert error < 1e-5, (name, error)
