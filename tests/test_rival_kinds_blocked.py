"""The block-sparse rivals 'longformer', 'bigbird' and 'sparse_transformer': their
blocked math against dense float64 masked softmax, the patterns the papers
describe, padding invariance, causal zero leakage and decoding, and each in a
model, with no n x n intermediate at n = 1024."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.attention_kinds import bigbird
from linformer_jax.model.attention_kinds import longformer
from linformer_jax.model.attention_kinds import sparse_transformer
from tests.run_helpers import small_model_config

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 23, 2, 4
# Small patterns, each with blocks that do not divide LENGTH.
LONGFORMER = longformer.LongformerPattern(window=6, global_tokens=2)
BIGBIRD = bigbird.BigBirdPattern(block=3, global_blocks=1, random_blocks=2)
FIXED = sparse_transformer.SparsePattern(kind='fixed', block=5, summary=2)
STRIDED = sparse_transformer.SparsePattern(kind='strided', block=4, summary=1)
# (name, pattern, has a causal form)
PATTERNS = [
    ('longformer', LONGFORMER, True),
    ('bigbird', BIGBIRD, False),
    ('fixed', FIXED, True),
    ('strided', STRIDED, True),
]
CAUSAL_PATTERNS = [(name, pattern) for name, pattern, causal in PATTERNS if causal]


def random_qkv(seed, length=LENGTH, scale=1.0, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (batch, length, heads, head_dim)
  return tuple(scale * jax.random.normal(key, shape, jnp.float32) for key in keys)


def priorities(seed=3, max_blocks=16):
  return bigbird.random_priorities(jax.random.PRNGKey(seed), (max_blocks, max_blocks))


def holey_mask(length=LENGTH):
  """Example 0 is right-padded after 18 tokens; example 1 starts with two
  padded positions, has a hole of a whole block (6..8 at b = 3) and is
  right-padded after 21."""
  mask = np.ones((BATCH, length), bool)
  mask[0, 18:] = False
  mask[1, :2] = False
  mask[1, 6:9] = False
  mask[1, 21:] = False
  return jnp.asarray(mask)


def run(name, pattern, q, k, v, mask, causal=False):
  """The kind's pure function, compiled once per pattern and shapes."""
  return _compiled(q, k, v, mask, name=name, pattern=pattern, causal=causal)


@functools.partial(jax.jit, static_argnames=('name', 'pattern', 'causal'))
def _compiled(q, k, v, mask, *, name, pattern, causal):
  if name == 'longformer':
    return longformer.longformer_attention(q, k, v, mask, pattern=pattern, causal=causal)
  if name == 'bigbird':
    return bigbird.bigbird_attention(q, k, v, priorities(), mask, pattern=pattern)
  return sparse_transformer.sparse_transformer_attention(
      q, k, v, mask, pattern=pattern, causal=causal
  )


# The patterns as the papers state them, an n x n boolean matrix each,
# written position by position.


def longformer_mask(n, pattern, causal):
  mask = np.zeros((n, n), bool)
  for i in range(n):
    for j in range(n):
      in_window = abs(i - j) <= pattern.window // 2
      is_global = i < pattern.global_tokens or j < pattern.global_tokens
      mask[i, j] = (in_window or is_global) and (j <= i or not causal)
  return mask


def sparse_mask(n, pattern, causal):
  stride, summary = pattern.block, pattern.summary
  mask = np.zeros((n, n), bool)
  for i in range(n):
    for j in range(n):
      if pattern.kind == 'fixed':
        sees = i // stride == j // stride or j % stride >= stride - summary
      else:
        sees = abs(i - j) <= stride or (i - j) % stride == 0
      mask[i, j] = sees and (j <= i or not causal)
  return mask


def bigbird_block_ids(n, pattern, key_padding_mask):
  """The kind's window and random blocks for these examples (numpy)."""
  num_blocks = -(-n // pattern.block)
  real = np.zeros((BATCH, num_blocks * pattern.block), bool)
  real[:, :n] = True if key_padding_mask is None else np.asarray(key_padding_mask)
  real_blocks = real.reshape(BATCH, num_blocks, pattern.block).any(-1)
  ids, valid = bigbird.bigbird_key_blocks(priorities(), jnp.asarray(real_blocks), pattern)
  return np.asarray(ids), np.asarray(valid), real_blocks


def bigbird_mask(n, pattern, key_padding_mask):
  """[batch, n, n]: query block a sees key block c when either is global, when
  |a - c| <= 1, or when c is one of a's random blocks."""
  ids, valid, _ = bigbird_block_ids(n, pattern, key_padding_mask)
  b, g = pattern.block, pattern.global_blocks
  mask = np.zeros((BATCH, n, n), bool)
  for example in range(BATCH):
    for i in range(n):
      for j in range(n):
        a, c = i // b, j // b
        randoms = {ids[example, a, s] for s in range(3, ids.shape[-1]) if valid[example, a, s]}
        mask[example, i, j] = a < g or c < g or abs(a - c) <= 1 or c in randoms
  return mask


def pattern_mask(name, pattern, n, causal, key_padding_mask=None):
  if name == 'longformer':
    return longformer_mask(n, pattern, causal)
  if name == 'bigbird':
    return bigbird_mask(n, pattern, key_padding_mask)
  return sparse_mask(n, pattern, causal)


def naive_masked_softmax(q, k, v, pattern, key_padding_mask):
  """Dense float64 attention over the keys a [n, n] (or [batch, n, n]) pattern
  and the padding show each query; a query that sees none gets zeros."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, n = q.shape[:2]
  real = np.ones((batch, n), bool) if key_padding_mask is None else np.asarray(key_padding_mask)
  pattern = np.broadcast_to(pattern, (batch, n, n))
  out = np.zeros_like(q)
  for b in range(batch):
    visible = pattern[b] & real[b][None, :]
    for h in range(q.shape[2]):
      logits = q[b, :, h] @ k[b, :, h].T / np.sqrt(q.shape[-1])
      logits = np.where(visible, logits, -np.inf)
      peak = np.max(np.where(visible, logits, 0.0), axis=-1, keepdims=True)
      weights = np.where(visible, np.exp(logits - peak), 0.0)
      total = np.sum(weights, axis=-1, keepdims=True)
      out[b, :, h] = weights @ v[b, :, h] / np.where(total > 0, total, 1.0)
  return out


def real_rows(x, mask):
  x = np.asarray(x, np.float64)
  return x if mask is None else x[np.asarray(mask)]


def relative_error(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


@pytest.mark.parametrize('name,pattern,has_causal', PATTERNS)
def test_blocked_attention_matches_the_dense_float64_masked_softmax(name, pattern, has_causal):
  q, k, v = random_qkv(seed=1)
  cases = [(None, False), (holey_mask(), False)] + [(holey_mask(), True)] * has_causal
  for mask, causal in cases:
    actual = run(name, pattern, q, k, v, mask, causal)
    expected = naive_masked_softmax(
        q, k, v, pattern_mask(name, pattern, LENGTH, causal, mask), mask
    )
    assert actual.dtype == jnp.float32 and actual.shape == q.shape
    assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-5


@pytest.mark.parametrize(
    'name,pattern',
    [
        ('longformer', longformer.LongformerPattern(window=4, global_tokens=0)),
        ('longformer', longformer.LongformerPattern(window=40, global_tokens=3)),
        ('fixed', sparse_transformer.SparsePattern(kind='fixed', block=4, summary=4)),
        ('strided', sparse_transformer.SparsePattern(kind='strided', block=30, summary=1)),
        ('bigbird', bigbird.BigBirdPattern(block=4, global_blocks=0, random_blocks=9)),
        ('bigbird', bigbird.BigBirdPattern(block=8, global_blocks=3, random_blocks=1)),
    ],
)
def test_edge_patterns_match_too(name, pattern):
  # No global token, a window or block longer than the sequence, summaries
  # that fill their block, more random blocks than there are, everything global.
  q, k, v = random_qkv(seed=2)
  mask = holey_mask()
  actual = run(name, pattern, q, k, v, mask)
  expected = naive_masked_softmax(q, k, v, pattern_mask(name, pattern, LENGTH, False, mask), mask)
  assert relative_error(real_rows(actual, mask), real_rows(expected, mask)) < 1e-5


def observed_pattern(name, pattern, n, causal=False):
  """[n, n]: where output i depends on value j, read from the kind's own
  blocked computation (its Jacobian; a visible key has a softmax weight > 0).
  Causal, no gradient flows from a later query, key or value either."""
  q, k, v = random_qkv(seed=4, length=n, batch=1, heads=1, head_dim=2)
  inputs = (2, 0, 1) if causal else (2,)  # v first
  jacobians = jax.jacrev(lambda *qkv: run(name, pattern, *qkv, None, causal), inputs)(q, k, v)
  # [output position, input position]
  by_position = [np.any(np.asarray(j)[0, :, 0, :, 0, :, 0, :] != 0, axis=(1, 3)) for j in jacobians]
  if causal:
    later = np.triu(np.ones((n, n), bool), k=1)
    assert not any(np.any(seen[later]) for seen in by_position)
  return by_position[0]


def test_longformer_sees_its_window_and_the_global_tokens():
  n, half, g = 20, LONGFORMER.window // 2, LONGFORMER.global_tokens
  for causal in (False, True):
    seen = observed_pattern('longformer', LONGFORMER, n, causal)
    np.testing.assert_array_equal(seen, longformer_mask(n, LONGFORMER, causal))
    global_rows = np.tril(np.ones((g, n), bool)) if causal else np.ones((g, n), bool)
    np.testing.assert_array_equal(seen[:g], global_rows)  # global queries see all (before them)
    assert seen[g:, :g].all()  # every later query sees the global keys
    for i in range(g + half, n - half):  # w + 1 window positions, and the g global ones
      assert seen[i, g:].sum() == (half + 1 if causal else 2 * half + 1)
      assert seen[i, i - half : i + 1].all()


def test_bigbird_sees_its_window_the_global_blocks_and_r_random_blocks():
  n, b, g, r = 30, BIGBIRD.block, BIGBIRD.global_blocks, BIGBIRD.random_blocks
  num_blocks = n // b
  seen = observed_pattern('bigbird', BIGBIRD, n)
  # Whole blocks: the pattern is one of blocks.
  by_block = seen.reshape(num_blocks, b, num_blocks, b)
  assert np.all(by_block == by_block[:, :1, :, :1])
  blocks_seen = by_block[:, 0, :, 0]
  assert blocks_seen[:g].all() and blocks_seen[:, :g].all()
  for a in range(g, num_blocks):
    window = {c for c in (a - 1, a, a + 1) if 0 <= c < num_blocks}
    assert window <= set(np.flatnonzero(blocks_seen[a]))
    randoms = set(np.flatnonzero(blocks_seen[a])) - window - set(range(g))
    assert len(randoms) == r, (a, randoms)
  np.testing.assert_array_equal(seen, bigbird_mask(n, BIGBIRD, None)[0])
  # Different query blocks draw different random blocks.
  assert len({tuple(row) for row in blocks_seen[g:]}) > num_blocks // 2


def test_bigbird_random_blocks_are_distinct_real_and_outside_window_and_globals():
  mask = holey_mask()
  ids, valid, real_blocks = bigbird_block_ids(LENGTH, BIGBIRD, mask)
  num_blocks = real_blocks.shape[1]
  for example in range(BATCH):
    for a in range(num_blocks):
      randoms = [ids[example, a, s] for s in range(3, ids.shape[-1]) if valid[example, a, s]]
      candidates = [
          c
          for c in range(BIGBIRD.global_blocks, num_blocks)
          if abs(c - a) > 1 and real_blocks[example, c]
      ]
      assert len(set(randoms)) == len(randoms) == min(BIGBIRD.random_blocks, len(candidates))
      assert set(randoms) <= set(candidates)
  # Example 1's block 2 holds padding only: no query block picks it.
  assert not real_blocks[1, 2]
  assert not np.any((ids[1, :, 3:] == 2) & valid[1, :, 3:])


@pytest.mark.parametrize('pattern', [FIXED, STRIDED])
def test_sparse_transformer_sees_its_block_summaries_or_strides(pattern):
  n, stride, summary = 20, pattern.block, pattern.summary  # whole blocks
  for causal in (False, True):
    seen = observed_pattern(pattern.kind, pattern, n, causal)
    np.testing.assert_array_equal(seen, sparse_mask(n, pattern, causal))
    for i in range(n):
      block = i // stride
      if pattern.kind == 'fixed':
        # Its block (up to i, causal) and c summaries of every other (earlier) block.
        own = i % stride + 1 if causal else stride
        other_blocks = block if causal else n // stride - 1
        assert seen[i].sum() == own + summary * other_blocks
        outside = [j for j in np.flatnonzero(seen[i]) if j // stride != block]
        assert all(j % stride >= stride - summary for j in outside)
      else:
        # i, the l positions before it (and after it), and every l-th one beyond.
        window = min(i, stride) + (0 if causal else min(n - 1 - i, stride))
        beyond = max(0, block - 1) + (0 if causal else max(0, (n - 1 - i) // stride - 1))
        assert seen[i].sum() == 1 + window + beyond


@pytest.mark.parametrize('name,pattern,has_causal', PATTERNS)
def test_padding_never_changes_the_real_tokens(name, pattern, has_causal):
  q, k, v = random_qkv(seed=5)
  mask = holey_mask()
  extra = 7  # whole new blocks of padding, and the last block's remainder
  longer = jnp.concatenate([mask, jnp.zeros((BATCH, extra), bool)], axis=1)
  for causal in (False, True) if has_causal else (False,):
    alone = run(name, pattern, q, k, v, mask, causal)
    for seed, scale in ((6, 1.0), (7, 50.0)):
      # Appended padding, and new contents in the padding already there.
      padding = random_qkv(seed, length=LENGTH + extra, scale=scale)
      padded = [
          jnp.where(longer[:, :, None, None], jnp.pad(x, [(0, 0), (0, extra), (0, 0), (0, 0)]), p)
          for x, p in zip((q, k, v), padding)
      ]
      out = run(name, pattern, *padded, longer, causal)
      np.testing.assert_allclose(
          real_rows(out[:, :LENGTH], mask), real_rows(alone, mask), rtol=1e-5, atol=1e-5
      )
    # NaN in padded keys and values reaches no query, real or padded.
    nan_padding = [jnp.where(longer[:, :, None, None], x, jnp.nan) for x in padded[1:]]
    out = run(name, pattern, padded[0], *nan_padding, longer, causal)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(
        real_rows(out[:, :LENGTH], mask), real_rows(alone, mask), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize('name,pattern,has_causal', PATTERNS)
def test_a_query_that_sees_no_real_key_stays_finite(name, pattern, has_causal):
  q, k, v = random_qkv(seed=8)
  # Example 1 is all padding: none of its queries sees a real key.
  mask = jnp.asarray(np.arange(LENGTH)[None, :] < np.array([[LENGTH], [0]]))
  for causal in (False, True) if has_causal else (False,):
    out = run(name, pattern, q, k, v, mask, causal)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)


@pytest.mark.parametrize('name,pattern', CAUSAL_PATTERNS)
def test_no_later_token_changes_an_earlier_output(name, pattern):
  q, k, v = random_qkv(seed=9)
  for mask in (None, holey_mask()):
    out = run(name, pattern, q, k, v, mask, True)
    for t in (0, 4, 13):
      later = jnp.arange(LENGTH)[None, :, None, None] > t
      changed = [jnp.where(later, 40.0 * x[:, ::-1], x) for x in (q, k, v)]
      changed_out = run(name, pattern, *changed, mask, True)
      np.testing.assert_array_equal(changed_out[:, : t + 1], out[:, : t + 1])
      assert not np.allclose(changed_out[:, t + 1 :], out[:, t + 1 :])
  # No gradient flows from later either: `observed_pattern` checks it.


@pytest.mark.parametrize('name,pattern,has_causal', PATTERNS)
def test_bfloat16_inputs_give_bfloat16_outputs_near_float32(name, pattern, has_causal):
  # Causal and bidirectional passes share the blocked products.
  del has_causal
  q, k, v = random_qkv(seed=10)
  mask = holey_mask()
  full = run(name, pattern, q, k, v, mask)
  half = run(name, pattern, *(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)
  assert half.dtype == jnp.bfloat16
  assert relative_error(real_rows(half, mask), real_rows(full, mask)) < 3e-2


# The kinds in a model: settings of a tiny model (max_len 16).
MODEL_SETTINGS = {
    'longformer': {'longformer_window': 4, 'longformer_global_tokens': 1},
    'bigbird': {'bigbird_block_size': 4, 'bigbird_random_blocks': 1},
    'sparse_transformer': {'sparse_block_size': 4, 'sparse_summary_size': 2},
    'sparse_strided': {'sparse_pattern': 'strided', 'sparse_block_size': 4},
}


def model_config(setup, **overrides):
  kind = 'sparse_transformer' if setup == 'sparse_strided' else setup
  return small_model_config(attention=kind, extension_settings=MODEL_SETTINGS[setup], **overrides)


TOKENS = jax.random.randint(jax.random.PRNGKey(12), (2, 16), 0, 40)
TOKEN_MASK = jnp.arange(16)[None] < jnp.array([[16], [9]])


@functools.lru_cache(maxsize=None)
def masked_lm(setup):
  """The model, its compiled init and its variables."""
  model = models.MaskedLanguageModel(model_config(setup))
  init = jax.jit(model.init)
  return model, init, nn.meta.unbox(init(jax.random.PRNGKey(13), TOKENS, TOKEN_MASK))


@pytest.mark.parametrize('setup', ['longformer', 'bigbird', 'sparse_transformer'])
def test_a_tiny_masked_lm_runs_trains_and_attends_chunk_by_chunk_alike(setup):
  model, _, variables = masked_lm(setup)
  kind = model.config.attention_kind
  assert not kind.uses_kernel and not kind.queries_independent and not kind.uses_projection

  def loss(params):
    logits = model.apply({**variables, 'params': params}, TOKENS, TOKEN_MASK)
    return jnp.mean(jnp.where(TOKEN_MASK[..., None], logits, 0.0) ** 2), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables['params'])
  assert logits.shape == (2, 16, 40) and np.all(np.isfinite(logits))
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.all(np.isfinite(leaf)) for leaf in leaves)
  assert any(np.any(leaf != 0) for leaf in leaves)
  # Chunked inference (the MLP a chunk at a time, attention whole) gives the
  # same logits, and other tokens in the padding change no real token's.
  chunked = jax.jit(models.MaskedLanguageModel(model_config(setup, inference_chunk=4)).apply)
  np.testing.assert_allclose(chunked(variables, TOKENS, TOKEN_MASK), logits, rtol=1e-5, atol=1e-5)
  repadded = chunked(variables, TOKENS.at[1, 9:].set(7), TOKEN_MASK)
  np.testing.assert_allclose(repadded[1, :9], logits[1, :9], rtol=1e-5, atol=1e-5)


def test_bigbird_random_priorities_are_fixed_constants_drawn_from_the_seed():
  _, init, variables = masked_lm('bigbird')
  draw = lambda seed: nn.meta.unbox(init(jax.random.PRNGKey(seed), TOKENS, TOKEN_MASK))
  layer = lambda v, i: v['constants']['encoder'][f'layers_{i}']['attention']['random_priorities']
  assert layer(variables, 0).shape == (4, 4)  # max_len 16 in blocks of 4
  assert not np.allclose(layer(variables, 0), layer(variables, 1))
  np.testing.assert_array_equal(layer(draw(13), 0), layer(variables, 0))
  assert not np.allclose(layer(draw(1), 0), layer(variables, 0))
  flat_params = jax.tree_util.tree_flatten_with_path(variables['params'])[0]
  assert not any('random_priorities' in jax.tree_util.keystr(path) for path, _ in flat_params)


@pytest.mark.parametrize('setup', ['longformer', 'sparse_transformer', 'sparse_strided'])
def test_decoding_token_by_token_gives_the_causal_pass(setup):
  config = model_config(setup, causal=True, num_layers=1)
  model = models.CausalLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(10), (2, 16), 0, config.vocab_size)
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(11), tokens))
  whole = jax.jit(model.apply)(variables, tokens)
  empty = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), tokens[:, :1], decode=True)['cache']
  )
  cache = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), empty)

  @jax.jit
  def step(cache, token):
    logits, updated = model.apply(
        {**variables, 'cache': cache}, token, decode=True, mutable=['cache']
    )
    return logits[:, 0], updated['cache']

  for t in range(tokens.shape[1]):
    logits, cache = step(cache, tokens[:, t : t + 1])
    np.testing.assert_allclose(logits, whole[:, t], rtol=1e-5, atol=1e-5)


def test_bigbird_has_no_causal_form_and_a_causal_config_is_refused_in_one_line():
  assert not bigbird.BigBird.supports_causal
  with pytest.raises(ConfigError) as error:
    model_config('bigbird', causal=True)
  message = str(error.value)
  assert message.startswith('config.model.causal=True is not allowed')
  assert "attention='bigbird' has no left-to-right form" in message and '\n' not in message


@pytest.mark.parametrize(
    'kind,field,value,words',
    [
        ('longformer', 'longformer_window', 5, 'even positive integer'),
        ('longformer', 'longformer_window', 0, 'even positive integer'),
        ('longformer', 'longformer_global_tokens', -1, 'integer >= 0'),
        ('bigbird', 'bigbird_block_size', 0, 'positive integer'),
        ('bigbird', 'bigbird_global_blocks', -2, 'integer >= 0'),
        ('bigbird', 'bigbird_random_blocks', 1.5, 'integer >= 0'),
        ('sparse_transformer', 'sparse_pattern', 'diagonal', "'fixed', 'strided'"),
        ('sparse_transformer', 'sparse_block_size', 0, 'positive integer'),
        ('sparse_transformer', 'sparse_summary_size', True, 'positive integer'),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_field(kind, field, value, words):
  with pytest.raises(ConfigError) as error:
    small_model_config(attention=kind, extension_settings={field: value})
  message = str(error.value)
  assert message.startswith(f'config.model.{field}={value!r} is not allowed')
  assert words in message and '\n' not in message


def test_a_summary_longer_than_its_block_is_one_line_naming_the_field():
  config = small_model_config(
      attention='sparse_transformer',
      extension_settings={'sparse_block_size': 4, 'sparse_summary_size': 6},
  )
  model = models.MaskedLanguageModel(config)
  with pytest.raises(ConfigError) as error:
    model.init(jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32))
  message = str(error.value)
  assert message.startswith('config.model.sparse_summary_size=6 is not allowed')
  assert 'sparse_block_size=4' in message and '\n' not in message


def test_attend_outside_a_model_needs_a_bound_config():
  q, k, v = random_qkv(seed=14)
  kind = longformer.Longformer('longformer')
  with pytest.raises(ValueError, match=r'with_config\(config\)'):
    kind.attend(q, k, v, None, kernel='einsum')
  config = small_model_config(
      attention='longformer',
      extension_settings={
          'longformer_window': LONGFORMER.window,
          'longformer_global_tokens': LONGFORMER.global_tokens,
      },
  )
  bound = kind.with_config(config)
  out = jax.jit(lambda q, k, v: bound.attend(q, k, v, None, kernel='einsum'))(q, k, v)
  np.testing.assert_allclose(out, run('longformer', LONGFORMER, q, k, v, None), atol=1e-6)
  assert kind.config is None


LONG = 1024
# Settings at n = 1024: blocks of 64 (the window's w / 2, the fixed pattern's l) or 32.
LONG_SETTINGS = {
    'full': {},
    'longformer': {'longformer_window': 128},
    'bigbird': {'bigbird_block_size': 32},
    'sparse_transformer': {'sparse_block_size': 64},
    'sparse_strided': {'sparse_pattern': 'strided', 'sparse_block_size': 32},
}


def lowered_forward(setup, causal):
  kind = 'sparse_transformer' if setup == 'sparse_strided' else setup
  config = small_model_config(
      attention=kind, extension_settings=LONG_SETTINGS[setup], max_len=LONG, causal=causal
  )
  model = (models.CausalLanguageModel if causal else models.MaskedLanguageModel)(config)
  tokens = jax.ShapeDtypeStruct((1, LONG), jnp.int32)
  variables = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens))
  if causal:
    return jax.jit(model.apply).lower(variables, tokens).as_text()
  mask = jax.ShapeDtypeStruct((1, LONG), jnp.bool_)
  return jax.jit(model.apply).lower(variables, tokens, mask).as_text()


@pytest.mark.parametrize(
    'setup,causal',
    [
        ('full', False),
        ('longformer', False),
        ('longformer', True),
        ('bigbird', False),
        ('sparse_transformer', False),
        ('sparse_transformer', True),
        ('sparse_strided', False),
        ('sparse_strided', True),
    ],
)
def test_no_intermediate_is_n_by_n_at_n_1024(setup, causal):
  text = lowered_forward(setup, causal)
  # Every array of the program, by its shape: tensor<AxBx...xdtype>.
  shapes = [
      [int(size) for size in shape.split('x')[:-1]]
      for shape in re.findall(r'tensor<((?:\d+x)+)\w+>', text)
  ]
  largest = max(np.prod(shape) for shape in shapes)
  if setup == 'full':  # the check sees the matrix full attention holds
    assert '1024x1024' in text and largest >= LONG * LONG
    return
  assert '1024x1024' not in text
  assert largest < LONG * LONG / 2, largest
