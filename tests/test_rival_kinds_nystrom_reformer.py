"""The Linformer's rivals 'nystromformer' and 'reformer': their math against
dense float64 references, padding, the Reformer's causal zero leakage, tiny
models and their settings."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import models
from linformer_jax.model.attention_kinds import nystromformer
from linformer_jax.model.attention_kinds import reformer
from tests.run_helpers import small_model_config

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 11, 2, 4
CONV_WIDTH = 3
BUCKETS = 4  # c = ceil(11 / 4) = 3: four chunks, the last ending in a slot past the end
KINDS = ['nystromformer', 'reformer']


def random_qkv(seed, length=LENGTH, scale=1.0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (BATCH, length, HEADS, HEAD_DIM)
  return tuple(scale * jax.random.normal(key, shape, jnp.float32) for key in keys)


def holey_mask(length=LENGTH):
  """Example 0 is right-padded after 8 tokens; example 1 starts with two
  padded positions, has a hole at 5 and is right-padded after 9."""
  mask = np.ones((BATCH, length), bool)
  mask[0, 8:] = False
  mask[1, :2] = False
  mask[1, 5] = False
  mask[1, 9:] = False
  return jnp.asarray(mask)


def real_rows(x, mask):
  """Rows of real tokens only: padded queries carry no meaning."""
  x = np.asarray(x, np.float64)
  return x if mask is None else x[np.asarray(mask)]


def relative_error(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


def softmax(logits):
  logits = logits - logits.max(axis=-1, keepdims=True)
  weights = np.exp(logits)
  return weights / weights.sum(axis=-1, keepdims=True)


def as_float64(*arrays):
  return [np.asarray(x, np.float64) for x in arrays]


# Nystromformer.

# Jitted: one compilation per shape instead of one per operation.
nystrom = jax.jit(nystromformer.nystrom_attention, static_argnames=('landmarks', 'iterations'))


def naive_pinv(a, iterations):
  z = a.T / (np.abs(a).sum(axis=1).max() * np.abs(a).sum(axis=0).max())
  identity = np.eye(a.shape[0])
  for _ in range(iterations):
    az = a @ z
    z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
  return z


def naive_nystrom(q, k, v, mask, landmarks, conv=None, iterations=nystromformer.PINV_ITERATIONS):
  """The paper's formula example by example, head by head: the real tokens cut
  into `landmarks` near-equal runs, empty runs left out, every softmax over
  real keys only; the convolution as a loop over taps."""
  q, k, v = as_float64(q, k, v)
  batch, length, heads, head_dim = q.shape
  mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask)
  out = np.zeros_like(v)
  for b in range(batch):
    real = np.flatnonzero(mask[b])
    segment = np.arange(len(real)) * landmarks // len(real)
    runs = [real[segment == s] for s in range(landmarks) if np.any(segment == s)]
    for h in range(heads):
      q_landmarks = np.stack([q[b, run, h].mean(axis=0) for run in runs])
      k_landmarks = np.stack([k[b, run, h].mean(axis=0) for run in runs])
      to_landmarks = softmax(q[b, :, h] @ k_landmarks.T / np.sqrt(head_dim))
      between = softmax(q_landmarks @ k_landmarks.T / np.sqrt(head_dim))
      from_landmarks = softmax(q_landmarks @ k[b, real, h].T / np.sqrt(head_dim))
      out[b, :, h] = to_landmarks @ naive_pinv(between, iterations) @ from_landmarks @ v[b, real, h]
      if conv is not None:
        width = conv.shape[0]
        for t in range(length):
          for s in range(width):
            source = t + s - (width - 1) // 2
            if 0 <= source < length and mask[b, source]:
              out[b, t, h] += conv[s, h] * v[b, source, h]
  return out


def naive_softmax_attention(q, k, v, mask):
  q, k, v = as_float64(q, k, v)
  mask = np.ones(q.shape[:2], bool) if mask is None else np.asarray(mask)
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask[:, None, None, :], logits, -np.inf)
  return np.einsum('bhqk,bkhd->bqhd', softmax(logits), v)


def conv_taps(seed=3):
  return 0.5 * jax.random.normal(jax.random.PRNGKey(seed), (CONV_WIDTH, HEADS))


# 11 tokens: runs of 3 and 4 (3 landmarks), of 2 and 3 (4 landmarks); fewer with padding.
@pytest.mark.parametrize(
    'landmarks,use_mask,use_conv',
    [(3, False, False), (4, True, False), (4, False, True), (3, True, True)],
)
def test_nystrom_matches_the_dense_float64_reference(landmarks, use_mask, use_conv):
  q, k, v = random_qkv(seed=1)
  mask = holey_mask() if use_mask else None
  conv = conv_taps() if use_conv else None
  actual = nystrom(q, k, v, mask, landmarks=landmarks, value_conv=conv)
  expected = naive_nystrom(q, k, v, mask, landmarks, None if conv is None else np.asarray(conv))
  assert actual.dtype == jnp.float32
  assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-5


def test_segments_cut_the_real_tokens_into_near_equal_runs():
  membership = np.asarray(nystromformer.segment_membership(holey_mask(), LENGTH, 4))
  mask = np.asarray(holey_mask())
  assert np.all(membership.sum(axis=-1) == mask)  # one segment per real token, none for padding
  for b in range(BATCH):
    segment_of_real = membership[b][mask[b]].argmax(axis=-1)
    assert np.all(np.diff(segment_of_real) >= 0)  # runs in token order
    sizes = membership[b].sum(axis=0)
    assert sizes.max() - sizes.min() <= 1 and sizes.min() >= 1
  # Fewer real tokens than landmarks: a token each, the other segments empty.
  few = np.asarray(nystromformer.segment_membership(holey_mask(), LENGTH, 10))
  assert np.all(few.sum(axis=1) <= 1) and np.all(few.sum(axis=(1, 2)) == mask.sum(axis=1))


def test_nystrom_with_a_landmark_per_token_is_softmax_attention():
  # Measured relative errors on these inputs (no mask, holey mask): the paper's
  # 6 steps 1.2% and 0.6%, the pseudo-inverse unconverged along A's small
  # singular values; 30 steps 2.5e-5 and 1e-6 in float32, 3e-14 in float64.
  q, k, v = random_qkv(seed=2, scale=2.0)
  for mask in (None, holey_mask()):
    exact = real_rows(naive_softmax_attention(q, k, v, mask), mask)
    for iterations, tolerance in ((nystromformer.PINV_ITERATIONS, 3e-2), (30, 1e-4)):
      out = nystrom(q, k, v, mask, landmarks=LENGTH, iterations=iterations)
      assert relative_error(real_rows(out, mask), exact) < tolerance
    converged = naive_nystrom(q, k, v, mask, LENGTH, iterations=30)
    assert relative_error(real_rows(converged, mask), exact) < 1e-10


def test_the_iterative_pseudo_inverse_converges_and_keeps_empty_landmarks_empty():
  logits = 2.0 * jax.random.normal(jax.random.PRNGKey(4), (5, 5))
  a = jax.nn.softmax(logits, axis=-1)
  a = a.at[3].set(0.0).at[:, 3].set(0.0)  # landmark 3 is empty
  pinv = jax.jit(nystromformer.iterative_pinv, static_argnames='iterations')
  z = np.asarray(pinv(a, iterations=30), np.float64)
  np.testing.assert_allclose(z, np.linalg.pinv(np.asarray(a, np.float64)), atol=1e-4)
  six_steps = np.asarray(pinv(a))
  np.testing.assert_allclose(six_steps, naive_pinv(np.asarray(a, np.float64), 6), atol=1e-5)
  assert np.all(six_steps[3] == 0) and np.all(six_steps[:, 3] == 0)
  assert np.all(pinv(jnp.zeros((3, 3))) == 0)


@pytest.mark.parametrize('use_conv', [False, True])
def test_nystrom_padding_never_changes_the_real_tokens(use_conv):
  q, k, v = random_qkv(seed=5)
  conv = conv_taps() if use_conv else None
  attend = lambda q, k, v, mask: nystrom(q, k, v, mask, landmarks=4, value_conv=conv)
  alone = attend(q, k, v, None)
  # Five padded positions appended, holding random draws, large values or NaN.
  mask = jnp.broadcast_to(jnp.arange(LENGTH + 5)[None, :] < LENGTH, (BATCH, LENGTH + 5))
  nan = [jnp.full((BATCH, 5, HEADS, HEAD_DIM), jnp.nan)] * 3
  for padding in (random_qkv(6, length=5), random_qkv(7, length=5, scale=1e4), nan):
    padded = [jnp.concatenate([x, pad], axis=1) for x, pad in zip((q, k, v), padding)]
    np.testing.assert_allclose(attend(*padded, mask)[:, :LENGTH], alone, rtol=1e-5, atol=1e-5)
  # Holes: what they hold never matters.
  hole = ~holey_mask()[:, :, None, None]
  before = attend(q, k, v, holey_mask())
  changed = [jnp.where(hole, jnp.nan, x) for x in (q, k, v)]
  after = attend(*changed, holey_mask())
  np.testing.assert_array_equal(real_rows(after, holey_mask()), real_rows(before, holey_mask()))


# Reformer.


def random_rotations(seed=8, rounds=3, buckets=BUCKETS):
  shape = (rounds, HEAD_DIM, buckets // 2)
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def naive_buckets(q, rotations, mask):
  """[batch, heads, rounds, length] by argmax [q W; -q W] in float64; padding B."""
  q, rotations = as_float64(q, rotations)
  rotated = np.einsum('bnhd,rdk->bhrnk', q, rotations)
  buckets = np.argmax(np.concatenate([rotated, -rotated], axis=-1), axis=-1)
  if mask is None:
    return buckets
  return np.where(np.asarray(mask)[:, None, None, :], buckets, 2 * rotations.shape[-1])


def naive_lsh(q, v, rotations, mask, causal):
  """The same hashing, then the keys open to each query as an [n, n] mask
  (the union over rounds) and one dense softmax over them."""
  q, v = as_float64(q, v)
  batch, length, heads, head_dim = q.shape
  mask = np.ones((batch, length), bool) if mask is None else np.asarray(mask)
  buckets = naive_buckets(q, rotations, mask)
  chunk = -(-length // (2 * rotations.shape[-1]))
  position = np.arange(length)
  earlier_or_same = position[None, :] <= position[:, None]  # [query, key]
  out = np.zeros_like(v)
  for b in range(batch):
    for h in range(heads):
      opened = np.zeros((length, length), bool)
      for bucket in buckets[b, h]:
        slot = np.argsort(np.argsort(bucket * length + position, kind='stable'), kind='stable')
        if causal:
          # The last `chunk` keys of its own bucket up to the query.
          back = slot[:, None] - slot[None, :]
          same_bucket = bucket[:, None] == bucket[None, :]
          opened |= same_bucket & earlier_or_same & (back <= chunk)
        else:
          back = slot[:, None] // chunk - slot[None, :] // chunk
          opened |= (back == 0) | (back == 1)
      opened &= mask[b][None, :]
      keys = q[b, :, h] / np.linalg.norm(q[b, :, h], axis=-1, keepdims=True)
      logits = q[b, :, h] @ keys.T / np.sqrt(head_dim) - reformer.SELF_PENALTY * np.eye(length)
      with np.errstate(invalid='ignore'):  # a padded query has no key: NaN, never read
        out[b, :, h] = softmax(np.where(opened, logits, -np.inf)) @ v[b, :, h]
  return out


_jitted_lsh = jax.jit(reformer.lsh_attention, static_argnames='causal')


def lsh(q, v, rotations, mask, causal):
  return _jitted_lsh(q, v, rotations, mask, causal=causal)


@pytest.mark.parametrize('rounds', [1, 3])
@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('use_mask', [False, True])
def test_lsh_matches_the_dense_float64_reference_of_the_same_hashing(use_mask, causal, rounds):
  q, _, v = random_qkv(seed=9)
  rotations = random_rotations(rounds=rounds)
  mask = holey_mask() if use_mask else None
  np.testing.assert_array_equal(
      reformer.lsh_buckets(q, rotations, mask), naive_buckets(q, rotations, mask)
  )
  actual = lsh(q, v, rotations, mask, causal)
  expected = naive_lsh(q, v, rotations, mask, causal)
  assert actual.dtype == jnp.float32
  assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-5


def test_a_query_attends_to_itself_only_when_nothing_else_is_open():
  q, _, v = random_qkv(seed=10)
  out = lsh(q, v, random_rotations(), None, causal=True)
  # Position 0 of a causal pass has no earlier key: its output is its value.
  np.testing.assert_allclose(out[:, 0], v[:, 0], rtol=1e-6)
  # Every query of a bidirectional pass has other keys in its window: its own
  # value takes no weight, so changing it changes only the others' outputs.
  bidirectional = lsh(q, v, random_rotations(), None, causal=False)
  bumped = lsh(q, v.at[:, 4].add(1.0), random_rotations(), None, causal=False)
  np.testing.assert_array_equal(bumped[:, 4], bidirectional[:, 4])


@pytest.mark.parametrize('causal', [False, True])
def test_lsh_padding_content_never_changes_the_real_tokens(causal):
  q, _, v = random_qkv(seed=11)
  rotations = random_rotations()
  mask = holey_mask()
  before = lsh(q, v, rotations, mask, causal)
  padded = ~mask[:, :, None, None]
  for fill in (1e4, jnp.nan):
    changed = [jnp.where(padded, fill, x) for x in (q, v)]
    after = lsh(*changed, rotations, mask, causal)
    np.testing.assert_array_equal(real_rows(after, mask), real_rows(before, mask))
  # Appended padding that keeps c = ceil(n / B) (11 -> 12 positions, c = 3)
  # keeps every chunk; more padding may move them (see reformer's docstring).
  extra = random_qkv(12, length=1)
  longer = [jnp.concatenate([x, pad], axis=1) for x, pad in zip((q, v), (extra[0], extra[2]))]
  longer_mask = jnp.concatenate([mask, jnp.zeros((BATCH, 1), bool)], axis=1)
  out = lsh(*longer, rotations, longer_mask, causal)
  np.testing.assert_allclose(real_rows(out[:, :LENGTH], mask), real_rows(before, mask), atol=1e-6)


def test_no_later_token_changes_an_earlier_causal_lsh_output():
  q, _, v = random_qkv(seed=13)
  rotations = random_rotations()
  for mask in (None, holey_mask()):
    real = np.ones((BATCH, LENGTH), bool) if mask is None else np.asarray(mask)
    out = lsh(q, v, rotations, mask, True)
    for t in (0, 3, 6):
      later = jnp.arange(LENGTH)[None, :, None, None] > t
      # Reversed, scaled later tokens hash elsewhere and move earlier tokens' slots.
      changed = [jnp.where(later, 40.0 * x[:, ::-1], x) for x in (q, v)]
      changed_out = lsh(*changed, rotations, mask, True)
      earlier = jnp.arange(LENGTH) <= t
      np.testing.assert_allclose(
          real_rows(changed_out, real & earlier), real_rows(out, real & earlier), atol=1e-6
      )
      assert not np.allclose(changed_out[:, t + 1 :], out[:, t + 1 :])
    # Nor does a gradient flow from a later position to an earlier output.
    # (Only real queries: a padded one's output carries no meaning.)
    real_out = lambda q, v: jnp.where(real[:, :, None, None], lsh(q, v, rotations, mask, True), 0)
    jacobians = jax.jit(jax.jacrev(real_out, argnums=(0, 1)))(q, v)
    later = np.triu(np.ones((LENGTH, LENGTH), bool), k=1)  # [t, s]: s > t
    for jacobian in jacobians:
      by_position = np.moveaxis(np.asarray(jacobian), (1, 5), (0, 1))
      assert np.all(by_position[later] == 0)


def test_bfloat16_inputs_give_bfloat16_outputs_near_float32():
  q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(seed=14))
  wide = [x.astype(jnp.float32) for x in (q, k, v)]  # the same values: the same buckets
  mask = holey_mask()
  pairs = [
      (
          nystrom(q, k, v, mask, landmarks=4, value_conv=conv_taps()),
          nystrom(*wide, mask, landmarks=4, value_conv=conv_taps()),
      )
  ]
  for causal in (False, True):
    pairs.append(
        (
            lsh(q, v, random_rotations(), mask, causal),
            lsh(wide[0], wide[2], random_rotations(), mask, causal),
        )
    )
  for half, full in pairs:
    assert half.dtype == jnp.bfloat16
    assert relative_error(real_rows(half, mask), real_rows(full, mask)) < 3e-2


# In a model.


def test_both_kinds_declare_what_the_layers_need():
  nystrom_kind, lsh_kind = (attention_kinds.kind(name) for name in KINDS)
  for kind in (nystrom_kind, lsh_kind):
    assert not kind.uses_kernel and not kind.queries_independent and not kind.uses_projection
  assert not nystrom_kind.supports_causal and lsh_kind.supports_causal


def test_nystrom_attend_reads_its_landmarks_from_the_bound_config():
  q, k, v = random_qkv(seed=9)
  kind = attention_kinds.kind('nystromformer').with_parameters({'value_conv': conv_taps()})
  with pytest.raises(ValueError, match=r'with_config\(config\)'):
    kind.attend(q, k, v, None, kernel='einsum')
  bound = kind.with_config(model_config('nystromformer'))  # 5 landmarks
  attend = jax.jit(lambda q, k, v, mask: bound.attend(q, k, v, mask, kernel='einsum'))
  for mask in (None, holey_mask()):
    expected = nystrom(q, k, v, mask, landmarks=5, value_conv=conv_taps())
    np.testing.assert_array_equal(attend(q, k, v, mask), expected)


def model_config(kind, **overrides):
  settings = {
      'nystromformer': {'nystrom_landmarks': 5, 'nystrom_conv_kernel': CONV_WIDTH},
      'reformer': {'reformer_n_hashes': 2, 'reformer_bucket_size': 4},
  }[kind]
  return small_model_config(attention=kind, extension_settings=settings, **overrides)


@functools.lru_cache(maxsize=None)
def masked_lm(kind):
  """A one-layer masked LM of the kind, its variables and a batch, shared by the tests."""
  model = models.MaskedLanguageModel(model_config(kind, num_layers=1))
  tokens = jax.random.randint(jax.random.PRNGKey(12), (2, 16), 0, 40)
  mask = jnp.arange(16)[None] < jnp.array([[16], [9]])
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(13), tokens, mask))
  return model, variables, tokens, mask


@pytest.mark.parametrize('kind', KINDS)
def test_a_tiny_masked_lm_runs_and_its_gradient_is_finite(kind):
  model, variables, tokens, mask = masked_lm(kind)
  layer = variables['params']['encoder']['layers_0']['attention']
  if kind == 'nystromformer':
    assert layer['value_conv'].shape == (CONV_WIDTH, HEADS)
  else:  # shared QK: no key weights; the rotations are fixed, in 'constants'
    assert 'key' not in layer and 'rotations' not in layer
    rotations = variables['constants']['encoder']['layers_0']['attention']['rotations']
    assert rotations.shape == (2, HEAD_DIM, 2)  # max_len 16 / bucket_size 4: 4 buckets

  def loss(params):
    logits = model.apply({**variables, 'params': params}, tokens, mask)
    return jnp.mean(jnp.square(logits))

  value, grads = jax.jit(jax.value_and_grad(loss))(variables['params'])
  assert np.isfinite(value)
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.all(np.isfinite(leaf)) for leaf in leaves)
  assert np.any(grads['encoder']['layers_0']['attention']['query']['kernel'] != 0)
  if kind == 'nystromformer':
    assert np.any(grads['encoder']['layers_0']['attention']['value_conv'] != 0)


@pytest.mark.parametrize('kind', KINDS)
def test_an_inference_chunk_gives_the_same_outputs(kind):
  model, variables, tokens, mask = masked_lm(kind)
  chunked = models.MaskedLanguageModel(model_config(kind, num_layers=1, inference_chunk=4))
  np.testing.assert_allclose(
      jax.jit(chunked.apply)(variables, tokens, mask),
      jax.jit(model.apply)(variables, tokens, mask),
      rtol=1e-5,
      atol=1e-5,
  )


def test_a_causal_reformer_lm_sees_no_later_token():
  config = model_config('reformer', causal=True)
  model = models.CausalLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(15), (2, 16), 0, config.vocab_size)
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(16), tokens))
  constants = variables['constants']['encoder']
  rotations = [constants[f'layers_{i}']['attention']['rotations'] for i in (0, 1)]
  assert not np.allclose(rotations[0], rotations[1])  # one draw per layer
  apply = jax.jit(model.apply)
  logits = apply(variables, tokens)
  later = (tokens[:, ::-1] + 1) % config.vocab_size
  changed = apply(variables, tokens.at[:, 9:].set(later[:, 9:]))
  assert np.all(np.isfinite(logits))
  np.testing.assert_allclose(changed[:, :9], logits[:, :9], rtol=1e-5, atol=1e-5)
  assert not np.allclose(changed[:, 9:], logits[:, 9:])


@pytest.mark.parametrize(
    'field,value',
    [
        ('nystrom_landmarks', 0),
        ('nystrom_landmarks', -2),
        ('nystrom_conv_kernel', -1),
        ('reformer_n_hashes', 0),
        ('reformer_n_hashes', -1),
        ('reformer_bucket_size', 0),
        ('reformer_bucket_size', -4),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field(field, value):
  kind = 'nystromformer' if field.startswith('nystrom') else 'reformer'
  with pytest.raises(ConfigError) as error:
    small_model_config(attention=kind, extension_settings={field: value})
  message = str(error.value)
  assert message.startswith(f'config.model.{field}={value!r} is not allowed')
  assert 'use ' in message and '\n' not in message


def test_a_causal_nystromformer_is_refused_in_one_line():
  with pytest.raises(ConfigError) as error:
    small_model_config(attention='nystromformer', causal=True)
  message = str(error.value)
  assert message.startswith('config.model.causal=True is not allowed')
  assert "attention='nystromformer' has no left-to-right form" in message and '\n' not in message
