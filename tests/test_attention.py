"""The pure attention functions against a naive float64 reference and invariances."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.model import attention
from linformer_jax.model.attention_kinds import linformer
from linformer_jax.model.projections import conv
from linformer_jax.model.projections import max as max_pooling
from linformer_jax.model.projections import mean as mean_pooling

BATCH, LENGTH, HEADS, HEAD_DIM, PROJECTED = 3, 24, 4, 8, 6


def naive_attention(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d)) v, head by head, in float64 numpy."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  out = np.zeros_like(q)
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      logits = q[b, :, h] @ k[b, :, h].T / np.sqrt(q.shape[-1])
      if mask is not None:
        logits = np.where(np.asarray(mask[b])[None, :], logits, -np.inf)
      weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
      weights /= weights.sum(axis=-1, keepdims=True)
      out[b, :, h] = weights @ v[b, :, h]
  return out


def naive_linformer(q, k, v, e, f, mask=None):
  """Zero padded keys/values, project with E and F per head, then attend."""
  k, v, e, f = (np.asarray(a, np.float64) for a in (k, v, e, f))
  length = k.shape[1]
  if mask is not None:
    keep = np.asarray(mask, np.float64)[:, :, None, None]
    k, v = k * keep, v * keep
  heads = k.shape[2]
  e = np.broadcast_to(e, (heads,) + e.shape[-2:])[:, :length]
  f = np.broadcast_to(f, (heads,) + f.shape[-2:])[:, :length]
  projected_k = np.stack([e[h].T @ k[:, :, h] for h in range(heads)], axis=2)
  projected_v = np.stack([f[h].T @ v[:, :, h] for h in range(heads)], axis=2)
  return naive_attention(q, projected_k, projected_v)


def relative_error(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


def random_qkv(seed, batch=BATCH, length=LENGTH):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (batch, length, HEADS, HEAD_DIM)
  return tuple(jax.random.normal(key, shape, jnp.float32) for key in keys)


def padding_mask(lengths, length=LENGTH):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def masked_rows(x, mask):
  """Rows of real tokens only: padded queries carry no meaning."""
  return np.asarray(x)[np.asarray(mask)]


@pytest.mark.parametrize('use_mask', [False, True])
def test_dot_product_attention_matches_float64_reference(use_mask):
  q, k, v = random_qkv(seed=1)
  mask = padding_mask([LENGTH, 17, 5]) if use_mask else None
  actual = attention.dot_product_attention(q, k, v, key_padding_mask=mask)
  expected = naive_attention(q, k, v, mask)
  assert relative_error(actual, expected) < 1e-5


@pytest.mark.parametrize('use_mask', [False, True])
@pytest.mark.parametrize('per_head', [False, True])
def test_linformer_attention_matches_float64_reference(use_mask, per_head):
  q, k, v = random_qkv(seed=2)
  shape = ((HEADS,) if per_head else ()) + (LENGTH, PROJECTED)
  e = jax.random.normal(jax.random.PRNGKey(3), shape) / np.sqrt(PROJECTED)
  f = jax.random.normal(jax.random.PRNGKey(4), shape) / np.sqrt(PROJECTED)
  mask = padding_mask([LENGTH, 17, 5]) if use_mask else None
  actual = attention.linformer_attention(q, k, v, e, f, key_padding_mask=mask)
  expected = naive_linformer(q, k, v, e, f, mask)
  assert relative_error(actual, expected) < 1e-5


def test_linformer_with_identity_projection_is_full_attention():
  q, k, v = random_qkv(seed=5)
  identity = jnp.eye(LENGTH)
  linformer = attention.linformer_attention(q, k, v, identity, identity)
  full = attention.dot_product_attention(q, k, v)
  assert relative_error(linformer, full) < 1e-6


def test_shorter_inputs_use_the_first_rows_of_the_projection():
  q, k, v = random_qkv(seed=6, length=10)
  e = jax.random.normal(jax.random.PRNGKey(7), (LENGTH, PROJECTED))
  f = jax.random.normal(jax.random.PRNGKey(8), (LENGTH, PROJECTED))
  actual = attention.linformer_attention(q, k, v, e, f)
  expected = naive_linformer(q, k, v, e[:10], f[:10])
  assert relative_error(actual, expected) < 1e-5


def test_longer_inputs_than_the_projection_are_an_error_naming_both():
  q, k, v = random_qkv(seed=9, length=LENGTH)
  e = jnp.ones((LENGTH - 4, PROJECTED))
  with pytest.raises(ValueError, match=f'{LENGTH}.*{LENGTH - 4}'):
    attention.linformer_attention(q, k, v, e, e)


@pytest.mark.parametrize('projection', ['linear', 'mean', 'max', 'conv'])
def test_padding_invariance(projection):
  """An example's output is the same alone, batched with longer ones, padded."""
  max_len, real_len = LENGTH, 9
  window = max_len // PROJECTED
  weight = {
      'linear': jax.random.normal(jax.random.PRNGKey(10), (max_len, PROJECTED)),
      'conv': jax.random.normal(jax.random.PRNGKey(10), (window, HEAD_DIM, HEAD_DIM)) / HEAD_DIM,
  }.get(projection)

  def run(q, k, v, mask):
    return attention.attend(
        q,
        *linformer.compressed_keys_and_values(
            k,
            v,
            projection=projection,
            key_weight=weight,
            value_weight=weight,
            max_len=max_len,
            projected_len=PROJECTED,
            key_padding_mask=mask,
        ),
    )

  q, k, v = random_qkv(seed=11, batch=3, length=max_len)
  alone = run(q[:1, :real_len], k[:1, :real_len], v[:1, :real_len], None)[0]
  # Padding garbage must not leak: fill padded positions with large values.
  garbage = 1e3 * jnp.ones_like(k)
  for padded_len in (real_len, 13, 16, max_len):
    mask = padding_mask([real_len, padded_len, padded_len], length=padded_len)
    keep = mask[:, :, None, None]
    batch = [jnp.where(keep, x[:, :padded_len], garbage[:, :padded_len]) for x in (q, k, v)]
    batched = run(*batch, mask)[0, :real_len]
    np.testing.assert_allclose(batched, alone, rtol=1e-6, atol=1e-6)


def test_pooling_matches_a_naive_masked_window_reduction():
  x = jax.random.normal(jax.random.PRNGKey(12), (2, 10, HEADS, HEAD_DIM))
  mask = padding_mask([10, 5], length=10)
  mean, mean_mask = mean_pooling.mean_pool(x, window=4, max_len=12, key_padding_mask=mask)
  maximum, _ = max_pooling.max_pool(x, window=4, max_len=12, key_padding_mask=mask)
  x64 = np.asarray(x, np.float64)
  # Example 1 has real tokens 0..4: windows [0:4] full, [4:8] only position 4.
  np.testing.assert_allclose(mean[1, 0], x64[1, 0:4].mean(0), rtol=1e-5)
  np.testing.assert_allclose(mean[1, 1], x64[1, 4], rtol=1e-5)
  np.testing.assert_allclose(maximum[1, 1], x64[1, 4], rtol=1e-6)
  np.testing.assert_allclose(maximum[0, 2], x64[0, 8:10].max(0), rtol=1e-6)
  np.testing.assert_array_equal(mean_mask, [[True, True, True], [True, True, False]])


def test_conv_matches_naive_windowed_sum():
  x = jax.random.normal(jax.random.PRNGKey(13), (1, 8, HEADS, HEAD_DIM))
  kernel = jax.random.normal(jax.random.PRNGKey(14), (HEADS, 2, HEAD_DIM, HEAD_DIM))
  out, _ = conv.conv_sequence(x, kernel, max_len=8)
  x64, k64 = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
  for w in range(4):
    for h in range(HEADS):
      expected = sum(x64[0, 2 * w + j, h] @ k64[h, j] for j in range(2))
      np.testing.assert_allclose(out[0, w, h], expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float32():
  q, k, v = random_qkv(seed=15)
  e = jax.random.normal(jax.random.PRNGKey(16), (LENGTH, PROJECTED)) / np.sqrt(PROJECTED)
  full32 = attention.linformer_attention(q, k, v, e, e)
  as_bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v, e)]
  full16 = attention.linformer_attention(*as_bf16, as_bf16[-1])
  assert full16.dtype == jnp.bfloat16
  assert relative_error(full16.astype(jnp.float32), full32) < 3e-2


def test_a_fully_masked_example_gives_finite_output():
  q, k, v = random_qkv(seed=17)
  mask = padding_mask([LENGTH, 0, 3])
  out = attention.dot_product_attention(q, k, v, key_padding_mask=mask)
  assert np.all(np.isfinite(np.asarray(out)))
