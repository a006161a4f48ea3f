"""The Linformer's rivals, 'linear_transformer' and 'performer': their math against
dense float64 references, padding invariance, causal zero leakage, decoding, and
the Performer's fixed random features in a model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import models
from linformer_jax.model.attention_kinds import linear_transformer
from linformer_jax.model.attention_kinds import performer
from linformer_jax.training import train_steps
from tests.run_helpers import small_model_config

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 11, 2, 4
FEATURES = 10  # two blocks of HEAD_DIM orthogonal rows and a part of a third
CHUNK = 4  # causal steps: LENGTH crosses two chunk boundaries and ends inside a chunk
KINDS = ['linear_transformer', 'performer']


def random_qkv(seed, length=LENGTH, scale=1.0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (BATCH, length, HEADS, HEAD_DIM)
  return tuple(scale * jax.random.normal(key, shape, jnp.float32) for key in keys)


def random_features(seed=7, features=FEATURES):
  return performer.orthogonal_gaussian_features(jax.random.PRNGKey(seed), (features, HEAD_DIM))


def holey_mask(length=LENGTH):
  """Example 0 is right-padded after 8 tokens; example 1 starts with two
  padded positions, has a hole at 5 and is right-padded after 9."""
  mask = np.ones((BATCH, length), bool)
  mask[0, 8:] = False
  mask[1, :2] = False
  mask[1, 5] = False
  mask[1, 9:] = False
  return jnp.asarray(mask)


def naive_elu_features(x):
  x = np.asarray(x, np.float64)
  return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def naive_performer_features(x, w):
  """exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4), with no shift."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  scaled = x / x.shape[-1] ** 0.25
  exponents = scaled @ w.T - 0.5 * np.sum(scaled**2, axis=-1, keepdims=True)
  return np.exp(exponents) / np.sqrt(w.shape[0])


def naive_feature_attention(query_features, key_features, v, mask, causal):
  """The dense way: the [n, n] matrix of f_t . g_s, the keys a query may not
  see zeroed, each row divided by its sum; example by example, head by head."""
  v = np.asarray(v, np.float64)
  length = v.shape[1]
  mask = np.ones(v.shape[:2], bool) if mask is None else np.asarray(mask)
  out = np.zeros_like(v)
  for b in range(v.shape[0]):
    visible = mask[b][None, :] & (np.tril(np.ones((length, length), bool)) if causal else True)
    for h in range(v.shape[2]):
      scores = np.where(visible, query_features[b, :, h] @ key_features[b, :, h].T, 0.0)
      with np.errstate(invalid='ignore', divide='ignore'):
        out[b, :, h] = scores @ v[b, :, h] / scores.sum(axis=-1, keepdims=True)
  return out


def naive(kind, q, k, v, mask, causal, w=None):
  if kind == 'linear_transformer':
    features = naive_elu_features(q), naive_elu_features(k)
  else:
    features = naive_performer_features(q, w), naive_performer_features(k, w)
  return naive_feature_attention(*features, v, mask, causal)


def run(kind, q, k, v, mask, causal, w=None):
  """The kind's pure function for q, k, v."""
  if kind == 'linear_transformer':
    if causal:
      return linear_transformer.causal_linear_transformer_attention(q, k, v, mask, chunk=CHUNK)
    return linear_transformer.linear_transformer_attention(q, k, v, mask)
  if causal:
    return performer.causal_performer_attention(q, k, v, w, mask, chunk=CHUNK)
  return performer.performer_attention(q, k, v, w, mask)


def real_rows(x, mask):
  """Rows of real tokens only: padded queries carry no meaning."""
  x = np.asarray(x, np.float64)
  return x if mask is None else x[np.asarray(mask)]


def relative_error(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('use_mask', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_matches_the_dense_float64_reference(kind, use_mask, causal):
  q, k, v = random_qkv(seed=1)
  w = random_features()
  mask = holey_mask() if use_mask else None
  actual = run(kind, q, k, v, mask, causal, w)
  expected = naive(kind, q, k, v, mask, causal, w)
  assert actual.dtype == jnp.float32
  assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-5


@pytest.mark.parametrize('causal', [False, True])
def test_the_performer_is_stable_where_its_exponentials_leave_float32(causal):
  # Exponents of several hundred: exp underflows (or overflows) in float32
  # without the shifts, and the float64 reference still holds them.
  q, k, v = random_qkv(seed=2, scale=12.0)
  w = random_features()
  exponents = np.log(naive_performer_features(k, w))
  assert exponents.min() < -100
  mask = holey_mask()
  actual = run('performer', q, k, v, mask, causal, w)
  expected = naive('performer', q, k, v, mask, causal, w)
  assert np.all(np.isfinite(actual))
  assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-4


def test_random_features_are_orthogonal_blocks_that_estimate_the_softmax_kernel():
  w = np.asarray(random_features(features=3 * HEAD_DIM), np.float64)
  for block in range(3):
    rows = w[block * HEAD_DIM : (block + 1) * HEAD_DIM]
    gram = rows @ rows.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-5)
  # Many features: phi(q) . phi(k) is close to exp(q . k / sqrt(d)).
  q, k, _ = random_qkv(seed=3, scale=0.5)
  many = performer.orthogonal_gaussian_features(jax.random.PRNGKey(4), (4096, HEAD_DIM))
  estimate = np.sum(naive_performer_features(q, many) * naive_performer_features(k, many), -1)
  exact = np.exp(np.sum(np.asarray(q, np.float64) * np.asarray(k, np.float64), -1) / 2.0)
  assert relative_error(estimate, exact) < 0.05


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_padding_never_changes_the_real_tokens(kind, causal):
  # Real keys of large norm: their Performer exponents are below -100, so a
  # shift that counted padding would send their features below float32's range.
  q, k, v = random_qkv(seed=5, scale=30.0)
  w = random_features()
  alone = run(kind, q, k, v, None, causal, w)
  # The largest exponent any key has: x' = w_r for the longest w_r.
  longest = w[jnp.argmax(jnp.sum(w * w, axis=-1))] * HEAD_DIM**0.25
  aligned = jnp.broadcast_to(longest, (BATCH, 5, HEADS, HEAD_DIM))
  # Five padded positions appended, holding two random draws, then aligned keys.
  paddings = [random_qkv(6, length=5), random_qkv(7, length=5, scale=30.0)]
  paddings.append((paddings[0][0], aligned, paddings[0][2]))
  mask = jnp.broadcast_to(jnp.arange(LENGTH + 5)[None, :] < LENGTH, (BATCH, LENGTH + 5))
  for padding in paddings:
    padded = [jnp.concatenate([x, pad], axis=1) for x, pad in zip((q, k, v), padding)]
    out = run(kind, *padded, mask, causal, w)
    np.testing.assert_allclose(out[:, :LENGTH], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind', KINDS)
def test_no_later_token_changes_an_earlier_output(kind):
  q, k, v = random_qkv(seed=8)
  w = random_features()
  for mask in (None, holey_mask()):
    out = run(kind, q, k, v, mask, True, w)
    for t in (0, 3, 6):
      later = jnp.arange(LENGTH)[None, :, None, None] > t
      # Large later keys would move any shift that looked ahead.
      changed = [jnp.where(later, 40.0 * x[:, ::-1], x) for x in (q, k, v)]
      changed_out = run(kind, *changed, mask, True, w)
      np.testing.assert_array_equal(changed_out[:, : t + 1], out[:, : t + 1])
      assert not np.allclose(changed_out[:, t + 1 :], out[:, t + 1 :])
    # Nor does a gradient flow from a later position to an earlier output.
    jacobians = jax.jacrev(lambda q, k, v: run(kind, q, k, v, mask, True, w), argnums=(0, 1, 2))(
        q, k, v
    )
    later = np.triu(np.ones((LENGTH, LENGTH), bool), k=1)  # [t, s]: s > t
    for jacobian in jacobians:
      by_position = np.moveaxis(np.asarray(jacobian), (1, 5), (0, 1))
      assert np.all(by_position[later] == 0)


@pytest.mark.parametrize('kind', KINDS)
def test_bfloat16_inputs_give_bfloat16_outputs_near_float32(kind):
  q, k, v = random_qkv(seed=9)
  w = random_features()
  mask = holey_mask()
  for causal in (False, True):
    full = run(kind, q, k, v, mask, causal, w)
    half = run(kind, *(x.astype(jnp.bfloat16) for x in (q, k, v)), mask, causal, w)
    assert half.dtype == jnp.bfloat16
    assert relative_error(real_rows(half, mask), real_rows(full, mask)) < 3e-2


def test_both_kinds_are_built_in_without_projections():
  for name in KINDS:
    assert name in attention_kinds.BUILT_IN and name in attention_kinds.REGISTRY
    kind = attention_kinds.kind(name)
    assert not kind.uses_projection and kind.supports_causal


def model_config(kind, **overrides):
  settings = {'performer_features': 8} if kind == 'performer' else {}
  return small_model_config(attention=kind, extension_settings=settings, **overrides)


@pytest.mark.parametrize('kind', KINDS)
def test_decoding_token_by_token_gives_the_causal_pass(kind):
  config = model_config(kind, causal=True, num_layers=1)
  model = models.CausalLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(10), (2, 12), 0, config.vocab_size)
  variables = nn.meta.unbox(model.init(jax.random.PRNGKey(11), tokens))
  whole = model.apply(variables, tokens)
  cache = jax.tree_util.tree_map(
      jnp.zeros_like, model.init(jax.random.PRNGKey(0), tokens[:, :1], decode=True)['cache']
  )

  @jax.jit
  def step(cache, token):
    logits, updated = model.apply(
        {**variables, 'cache': cache}, token, decode=True, mutable=['cache']
    )
    return logits[:, 0], updated['cache']

  for t in range(tokens.shape[1]):
    logits, cache = step(cache, tokens[:, t : t + 1])
    np.testing.assert_allclose(logits, whole[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind', KINDS)
def test_queries_attended_chunk_by_chunk_give_the_same_outputs(kind):
  # Inference passes with model.inference_chunk call `attend` a chunk of queries at a time.
  tokens = jax.random.randint(jax.random.PRNGKey(12), (2, 16), 0, 40)
  mask = jnp.arange(16)[None] < jnp.array([[16], [9]])
  whole = models.MaskedLanguageModel(model_config(kind))
  variables = nn.meta.unbox(whole.init(jax.random.PRNGKey(13), tokens, mask))
  chunked = models.MaskedLanguageModel(model_config(kind, inference_chunk=4))
  np.testing.assert_allclose(
      chunked.apply(variables, tokens, mask),
      whole.apply(variables, tokens, mask),
      rtol=1e-5,
      atol=1e-5,
  )


def performer_variables(seed, **overrides):
  config = model_config('performer', **overrides)
  model = models.MaskedLanguageModel(config)
  tokens = jnp.ones((2, 16), jnp.int32)
  return model, tokens, nn.meta.unbox(model.init(jax.random.PRNGKey(seed), tokens))


def test_performer_features_are_fixed_constants_drawn_from_the_seed():
  model, tokens, variables = performer_variables(seed=0)
  logits = model.apply(variables, tokens, jnp.arange(16)[None] < jnp.array([[16], [9]]))
  assert logits.shape == (2, 16, 40) and np.all(np.isfinite(logits))
  features = lambda v: [v['constants']['encoder'][f'layers_{i}']['attention'] for i in (0, 1)]
  layer_0, layer_1 = features(variables)
  assert layer_0['random_features'].shape == (8, model.config.head_dim)
  assert not np.allclose(layer_0['random_features'], layer_1['random_features'])
  flat_params = jax.tree_util.tree_flatten_with_path(variables['params'])[0]
  assert not any('random_features' in jax.tree_util.keystr(path) for path, _ in flat_params)
  _, _, again = performer_variables(seed=0)
  _, _, other = performer_variables(seed=1)
  np.testing.assert_array_equal(features(again)[0]['random_features'], layer_0['random_features'])
  assert not np.allclose(features(other)[0]['random_features'], layer_0['random_features'])
  # A training state keeps them beside the parameters, out of the optimizer's reach.
  state = train_steps.init_train_state(
      jax.random.PRNGKey(0), model=model, optimizer=optax.adamw(1e-3), seq_len=16
  )
  np.testing.assert_array_equal(
      state.constants['constants']['encoder']['layers_0']['attention']['random_features'],
      layer_0['random_features'],
  )
  assert 'random_features' not in str(jax.tree_util.tree_structure(state.opt_state))


def test_scanned_layers_hold_one_draw_per_layer():
  model, _, variables = performer_variables(seed=0, scan_layers=True)
  stacked = variables['constants']['encoder']['layers']['layer']['attention']['random_features']
  assert stacked.shape == (2, 8, model.config.head_dim)
  assert not np.allclose(stacked[0], stacked[1])


@pytest.mark.parametrize('value', [0, -3, 2.5, True])
def test_a_bad_feature_count_is_one_line_naming_the_field(value):
  with pytest.raises(ConfigError) as error:
    small_model_config(attention='performer', extension_settings={'performer_features': value})
  message = str(error.value)
  assert message.startswith(f'config.model.performer_features={value!r} is not allowed')
  assert 'positive integer' in message and '\n' not in message


@attention_kinds.REGISTRY.register('whole_sequence_probe')
class WholeSequenceProbe(attention_kinds.AttentionKind):
  """Softmax attention that refuses a chunk of queries: its queries are not
  independent rows (`queries_independent`), as a windowed kind's are not."""

  queries_independent = False

  def attend(self, q, keys, values, key_mask, *, kernel):
    if q.shape[1] != keys.shape[1]:
      raise AssertionError(f'attend got {q.shape[1]} queries for {keys.shape[1]} keys')
    return super().attend(q, keys, values, key_mask, kernel=kernel)


def test_a_kind_whose_queries_are_not_independent_always_gets_the_whole_sequence():
  tokens = jax.random.randint(jax.random.PRNGKey(12), (2, 16), 0, 40)
  whole = models.MaskedLanguageModel(model_config('whole_sequence_probe'))
  variables = nn.meta.unbox(whole.init(jax.random.PRNGKey(13), tokens))
  chunked = models.MaskedLanguageModel(model_config('whole_sequence_probe', inference_chunk=4))
  # The MLP still runs chunk by chunk: the same sums in another order.
  np.testing.assert_allclose(
      chunked.apply(variables, tokens), whole.apply(variables, tokens), rtol=1e-6, atol=1e-6
  )
