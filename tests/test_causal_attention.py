"""Causal block attention against a naive float64 reference, causality and invariances."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.model.attention_kinds import causal_linformer

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 16, 2, 4
BLOCK, SLOTS, MAX_LEN = 4, 2, 16
PROJECTIONS = ['linear', 'random', 'mean', 'max', 'conv']


def random_qkv(seed, batch=BATCH, length=LENGTH):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (batch, length, HEADS, HEAD_DIM)
  return tuple(jax.random.normal(key, shape, jnp.float32) for key in keys)


def padding_mask(lengths, length=LENGTH):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def holey_mask(length):
  """Example 0 is all real; example 1 starts with a block of padding, has a
  padded pooling window in block 2 and is right-padded after 13 tokens."""
  mask = np.ones((2, length), bool)
  mask[1, :BLOCK] = False
  mask[1, 8:10] = False
  mask[1, 13:] = False
  return jnp.asarray(mask)


def make_weights(projection, per_head=False, seed=0, max_len=MAX_LEN, block=BLOCK, slots=SLOTS):
  """E and F for a projection: matrices, conv kernels or None for pooling."""
  heads = (HEADS,) if per_head else ()
  if projection in ('linear', 'random'):
    shape, scale = heads + (max_len, slots), 1 / np.sqrt(slots)
  elif projection == 'conv':
    shape, scale = heads + (block // slots, HEAD_DIM, HEAD_DIM), 1 / HEAD_DIM
  else:
    return None, None
  e, f = jax.random.split(jax.random.PRNGKey(100 + seed))
  return jax.random.normal(e, shape) * scale, jax.random.normal(f, shape) * scale


def run(q, k, v, projection, weights, mask=None, block=BLOCK, slots=SLOTS, **kwargs):
  return causal_linformer.causal_block_attention(
      q,
      k,
      v,
      block=block,
      slots=slots,
      projection=projection,
      key_weight=weights[0],
      value_weight=weights[1],
      key_padding_mask=mask,
      **kwargs,
  )


def naive_slot(x, mask, weight, projection, block, slots, slot):
  """Summary number `slot` of one example and head, by hand: (vector, real)."""
  first = slot // slots * block
  if projection in ('linear', 'random'):
    positions = range(first, first + block)
    real = [p for p in positions if mask[p]]
    return sum((weight[p, slot % slots] * x[p] for p in real), np.zeros(x.shape[-1])), bool(real)
  window = block // slots
  start = first + slot % slots * window
  real = [p for p in range(start, start + window) if mask[p]]
  if not real:
    return np.zeros(x.shape[-1]), False
  if projection == 'mean':
    return np.mean([x[p] for p in real], axis=0), True
  if projection == 'max':
    return np.max([x[p] for p in real], axis=0), True
  return sum(x[p] @ weight[p - start] for p in real), True


def naive_causal_block_attention(q, k, v, projection, weights, mask, block=BLOCK, slots=SLOTS):
  """Every query, head and example one at a time, in float64 numpy."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, head_dim = q.shape
  padded_len = -(-length // block) * block
  pad = ((0, 0), (0, padded_len - length), (0, 0), (0, 0))
  k, v = np.pad(k, pad), np.pad(v, pad)
  mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask)
  mask = np.pad(mask, ((0, 0), (0, padded_len - length)))
  matrix_ndim = 2 if projection in ('linear', 'random') else 3
  out = np.zeros_like(q)
  for h in range(heads):
    e, f = (None if w is None else np.asarray(w, np.float64) for w in weights)
    e, f = (w[h] if w is not None and w.ndim > matrix_ndim else w for w in (e, f))
    for b in range(batch):
      for t in range(length):
        first = t // block * block
        keys = [k[b, s, h] for s in range(first, t + 1) if mask[b, s]]
        values = [v[b, s, h] for s in range(first, t + 1) if mask[b, s]]
        for slot in range(t // block * slots):
          key, real = naive_slot(k[b, :, h], mask[b], e, projection, block, slots, slot)
          value, _ = naive_slot(v[b, :, h], mask[b], f, projection, block, slots, slot)
          if real:
            keys.append(key)
            values.append(value)
        if not keys:
          continue
        logits = np.array([q[b, t, h] @ key for key in keys]) / np.sqrt(head_dim)
        weights_t = np.exp(logits - logits.max())
        out[b, t, h] = (weights_t / weights_t.sum()) @ np.array(values)
  return out


def relative_error(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize('per_head', [False, True])
@pytest.mark.parametrize('projection', PROJECTIONS)
def test_no_gradient_flows_from_later_positions(projection, per_head):
  length = 12
  q, k, v = random_qkv(seed=1, length=length)
  weights = make_weights(projection, per_head)
  later = np.triu(np.ones((length, length), bool), k=1)  # [t, s]: s > t
  for mask in (None, holey_mask(length)):
    jacobians = jax.jacrev(
        lambda q, k, v: run(q, k, v, projection, weights, mask), argnums=(0, 1, 2)
    )(q, k, v)
    for jacobian in jacobians:
      # [batch, t, heads, dim, batch', s, heads', dim'] -> [t, s, ...]
      by_position = np.moveaxis(np.asarray(jacobian), (1, 5), (0, 1))
      assert np.all(by_position[later] == 0)
      assert np.any(by_position[~later] != 0)


def test_one_block_is_full_causal_attention():
  q, k, v = random_qkv(seed=2, length=12)
  causal = np.tril(np.ones((12, 12), bool))
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('bqhd,bkhd->bhqk', q64, k64) / np.sqrt(HEAD_DIM)
  logits = np.where(causal, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  expected = np.einsum('bhqk,bkhd->bqhd', weights / weights.sum(-1, keepdims=True), v64)
  for projection in ('linear', 'mean'):
    weights = make_weights(projection, max_len=12, block=12)
    actual = run(q, k, v, projection, weights, block=12)
    assert relative_error(actual, expected) < 1e-6


@pytest.mark.parametrize('use_mask', [False, True])
@pytest.mark.parametrize('per_head', [False, True])
@pytest.mark.parametrize('projection', PROJECTIONS)
def test_matches_float64_reference(projection, per_head, use_mask):
  length = 15  # not a multiple of BLOCK: padded internally
  q, k, v = random_qkv(seed=3, length=length)
  weights = make_weights(projection, per_head, seed=1)
  mask = holey_mask(length) if use_mask else None
  actual = run(q, k, v, projection, weights, mask)
  expected = naive_causal_block_attention(q, k, v, projection, weights, mask)
  real = np.ones((BATCH, length), bool) if mask is None else np.asarray(mask)
  assert relative_error(np.asarray(actual)[real], expected[real]) < 1e-5


@pytest.mark.parametrize('projection', ['linear', 'max'])
def test_query_blocks_per_step_matches_all_at_once(projection):
  q, k, v = random_qkv(seed=4)
  weights = make_weights(projection, per_head=True)
  mask = holey_mask(LENGTH)
  at_once = run(q, k, v, projection, weights, mask)
  for blocks_per_step in (1, 2, 3):  # 3 leaves a remainder of the 4 blocks
    stepped = run(q, k, v, projection, weights, mask, query_blocks_per_step=blocks_per_step)
    np.testing.assert_allclose(stepped, at_once, rtol=1e-6, atol=1e-6)
  # The stepped mode recomputes each step in the backward pass: same gradients.
  cotangent = jax.random.normal(jax.random.PRNGKey(5), q.shape)
  loss = lambda steps, *qkv: jnp.sum(cotangent * run(*qkv, projection, weights, mask, **steps))
  grads = jax.grad(loss, argnums=(1, 2, 3))
  for at_once_grad, stepped_grad in zip(
      grads({}, q, k, v), grads(dict(query_blocks_per_step=2), q, k, v)
  ):
    np.testing.assert_allclose(stepped_grad, at_once_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('per_head', [False, True])
@pytest.mark.parametrize('projection', PROJECTIONS)
def test_decoding_token_by_token_matches_the_full_sequence(projection, per_head):
  length = 13  # crosses three block boundaries and ends inside a block
  q, k, v = random_qkv(seed=5, length=length)
  weights = make_weights(projection, per_head, seed=2)
  full = run(q, k, v, projection, weights)
  step = jax.jit(
      functools.partial(
          causal_linformer.decode_step,
          block=BLOCK,
          slots=SLOTS,
          projection=projection,
          key_weight=weights[0],
          value_weight=weights[1],
      )
  )
  cache = causal_linformer.init_decode_cache(
      BATCH, MAX_LEN, HEADS, HEAD_DIM, block=BLOCK, slots=SLOTS
  )
  outputs = []
  for t in range(length):
    token = [x[:, t : t + 1] for x in (q, k, v)]
    out_t, cache = step(cache, *token, jnp.int32(t))
    outputs.append(out_t)
  np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('projection', PROJECTIONS)
def test_padding_invariance(projection):
  """An example's output is the same alone, and padded in a batch with a longer one."""
  real_len = 9
  weights = make_weights(projection, per_head=True, seed=3)
  q, k, v = random_qkv(seed=6, length=MAX_LEN)
  alone = run(q[:1, :real_len], k[:1, :real_len], v[:1, :real_len], projection, weights)[0]
  # Padding garbage must not leak: fill padded positions with large values.
  garbage = 1e3 * jnp.ones_like(k)
  for padded_len in (12, 13, MAX_LEN):
    mask = padding_mask([real_len, padded_len], length=padded_len)
    keep = mask[:, :, None, None]
    batch = [jnp.where(keep, x[:, :padded_len], garbage[:, :padded_len]) for x in (q, k, v)]
    batched = run(*batch, projection, weights, mask)
    assert np.all(np.isfinite(np.asarray(batched)))
    np.testing.assert_allclose(batched[0, :real_len], alone, rtol=1e-6, atol=1e-6)


MATRIX = make_weights('linear')
CONV = make_weights('conv')


@pytest.mark.parametrize(
    'projection, weights, block, slots, length, match',
    [
        ('linear', MATRIX, 0, SLOTS, LENGTH, 'block=0 must be at least 1'),
        ('linear', MATRIX, 5, SLOTS, LENGTH, 'block=5 must divide max_len=16'),
        ('mean', (None, None), BLOCK, 0, LENGTH, 'slots=0 must be between 1 and block=4'),
        ('mean', (None, None), BLOCK, 5, LENGTH, 'slots=5 must be between 1 and block=4'),
        ('max', (None, None), BLOCK, 3, LENGTH, "slots=3 must divide block=4 for 'max'"),
        (
            'conv',
            CONV,
            8,
            SLOTS,
            LENGTH,
            r'window must be block // slots = 4; got kernel shape \(2, 4, 4\)',
        ),
        ('linear', MATRIX, BLOCK, 3, LENGTH, "slots=3 must equal the projection's last axis, 2"),
        ('fourier', (None, None), BLOCK, SLOTS, LENGTH, "projection='fourier' is unknown"),
        ('linear', MATRIX, BLOCK, SLOTS, 20, 'Sequence length 20 is longer .* 16 positions'),
    ],
)
def test_bad_settings_say_what_to_change(projection, weights, block, slots, length, match):
  q, k, v = random_qkv(seed=7, length=length)
  with pytest.raises(ValueError, match=match):
    run(q, k, v, projection, weights, block=block, slots=slots)


def test_decoding_settings_that_do_not_fit_are_errors():
  with pytest.raises(ValueError, match='block=5 must divide max_len=16'):
    causal_linformer.init_decode_cache(1, MAX_LEN, HEADS, HEAD_DIM, block=5, slots=SLOTS)
  cache = causal_linformer.init_decode_cache(
      BATCH, 2 * MAX_LEN, HEADS, HEAD_DIM, block=BLOCK, slots=SLOTS
  )
  token = [x[:, :1] for x in random_qkv(seed=8, length=1)]
  with pytest.raises(ValueError, match='covers 16 positions but the cache max_len is 32'):
    causal_linformer.decode_step(
        cache,
        *token,
        0,
        block=BLOCK,
        slots=SLOTS,
        projection='linear',
        key_weight=MATRIX[0],
        value_weight=MATRIX[1],
    )


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float32():
  q, k, v = random_qkv(seed=9)
  weights = make_weights('linear')
  full32 = run(q, k, v, 'linear', weights)
  full16 = run(*(x.astype(jnp.bfloat16) for x in (q, k, v)), 'linear', weights)
  assert full16.dtype == jnp.bfloat16
  assert relative_error(full16.astype(jnp.float32), full32) < 3e-2
