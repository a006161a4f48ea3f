"""linformer_jax.testing, the checks an extension's author runs: every built-in
projection and attention kind passes them, each fails on a part made to fail
(a projection that lets padding in, a causal pass that sees later tokens, a
reference that disagrees). docs/extending.md's block of them runs in
tests/test_docs.py, as every Python block of the page does."""

import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax import testing
from linformer_jax.model import attention
from linformer_jax.model import attention_kinds
from linformer_jax.model import projections
from linformer_jax.model.attention_kinds.full import FullAttention
from linformer_jax.model.projections import mean
from linformer_jax.model.projections.windows import to_windows

# Settings that fit the checks' n = 16; performer's features fewer for speed.
KIND_SETTINGS = {
    'performer': {'performer_features': 8},
    'nystromformer': {'nystrom_landmarks': 4},
    'reformer': {'reformer_n_hashes': 2, 'reformer_bucket_size': 4},
    'longformer': {'longformer_window': 4, 'longformer_global_tokens': 1},
    'bigbird': {'bigbird_block_size': 4, 'bigbird_random_blocks': 1},
    'sparse_transformer': {'sparse_block_size': 4, 'sparse_summary_size': 2},
}
# What a kind's docstring says it cannot hold exactly: the Reformer's chunk
# length follows the padded length, so appended padding may move its chunks
# (what the padding holds never matters).
AMOUNT_OF_PADDING_MATTERS = ('reformer',)
# 'linformer' is checked with every projection; the other kinds hold none.
ATTENTION_KINDS = [name for name in attention_kinds.BUILT_IN if name != 'linformer']
CAUSAL_PROJECTIONS = [p for p in projections.BUILT_IN if projections.kind(p).supports_causal]
CAUSAL_KINDS = [k for k in ATTENTION_KINDS if attention_kinds.kind(k).supports_causal]


def cases(names, *representatives):
  """Each name a case; those beyond the representatives `long` (a check
  compiles a model: 2-7 s each on one busy core), as conftest's FAST_CASES."""
  return [
      pytest.param(name, marks=() if name in representatives else pytest.mark.long)
      for name in names
  ]


def config_of(num_layers=1, **fields):
  settings = KIND_SETTINGS.get(fields.get('attention'), {})
  return testing.small_config(num_layers=num_layers, extension_settings=settings, **fields)


@pytest.mark.parametrize('projection', cases(projections.BUILT_IN, 'linear'))
def test_every_built_in_projection_keeps_padding_out(projection):
  testing.check_padding_invariance(config_of(projection=projection))


@pytest.mark.parametrize('projection', cases(CAUSAL_PROJECTIONS, 'mean'))
def test_every_built_in_projection_compresses_causally_without_leakage(projection):
  testing.check_no_causal_leakage(config_of(projection=projection, causal=True))


@pytest.mark.parametrize('kind', cases(ATTENTION_KINDS, 'full', 'reformer'))
def test_every_built_in_attention_kind_keeps_padding_out(kind):
  testing.check_padding_invariance(
      config_of(attention=kind), appended_padding=kind not in AMOUNT_OF_PADDING_MATTERS
  )


@pytest.mark.parametrize('kind', cases(CAUSAL_KINDS, 'linear_transformer'))
def test_every_causal_built_in_attention_kind_sees_no_later_token(kind):
  testing.check_no_causal_leakage(config_of(attention=kind, causal=True))


@projections.REGISTRY.register('leaky_mean_for_tests')
class LeakyMean(projections.SequenceProjectionKind):
  """Mean pooling that forgets the padding mask: padding enters every window
  it lies in, and a short sequence's missing positions count as zeros."""

  windowed = True

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    windows, _ = to_windows(x, None, max_len, max_len // projected_len)
    return windows.mean(axis=2), None


@attention_kinds.REGISTRY.register('peeking_full_for_tests')
class PeekingFull(FullAttention):
  """Full attention whose causal pass forgets the causal mask."""

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    return attention.dot_product_attention(q, k, v, key_padding_mask=padding_mask)


def test_a_projection_that_lets_padding_in_is_caught():
  with pytest.raises(AssertionError) as error:
    testing.check_padding_invariance(config_of(projection='leaky_mean_for_tests'))
  message = str(error.value)
  assert message.startswith('padding leaks into real tokens')
  assert "projection='leaky_mean_for_tests'" in message and 'padding 7 real tokens to 16' in message
  # Without appended padding, the padding's content still leaks.
  with pytest.raises(AssertionError, match='changing the token ids of the 9 padded positions'):
    testing.check_padding_invariance(
        config_of(projection='leaky_mean_for_tests'), appended_padding=False
    )


def test_a_causal_pass_that_sees_later_tokens_is_caught():
  with pytest.raises(AssertionError) as error:
    testing.check_no_causal_leakage(config_of(attention='peeking_full_for_tests', causal=True))
  message = str(error.value)
  assert message.startswith("causal leakage (attention='peeking_full_for_tests', causal)")
  assert 'the output at position 0 takes a gradient of' in message
  assert 'from position 1, a later one' in message
  with pytest.raises(ValueError, match='checks a causal model'):
    testing.check_no_causal_leakage(config_of())


def naive_window_means(x, mask, window):
  """Per window of x [batch, n, heads, dim], the mean of its real rows."""
  batch, length, heads, dim = x.shape
  out = np.zeros((batch, length // window, heads, dim))
  for b in range(batch):
    for w in range(length // window):
      rows = [x[b, p] for p in range(w * window, (w + 1) * window) if mask[b, p]]
      out[b, w] = np.mean(rows, axis=0) if rows else 0.0
  return out


def test_a_reference_that_agrees_passes_and_one_that_does_not_is_named():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 16, 2, 3))
  mask = np.arange(16)[None] < np.array([[16], [6]])

  def pool(x, mask):
    return mean.mean_pool(x, window=4, max_len=16, key_padding_mask=mask)[0]

  testing.check_against_reference(pool, lambda x, mask: naive_window_means(x, mask, 4), x, mask)
  # The mask is compared too, and both outputs of a tuple.
  testing.check_against_reference(
      lambda x, mask: mean.mean_pool(x, window=4, max_len=16, key_padding_mask=mask),
      lambda x, mask: (naive_window_means(x, mask, 4), mask.reshape(2, 4, 4).any(-1)),
      x,
      mask,
  )

  def padding_included(x, mask):
    return naive_window_means(x, np.ones_like(mask), 4)

  with pytest.raises(AssertionError) as error:
    testing.check_against_reference(pool, padding_included, x, mask)
  message = str(error.value)
  assert message.startswith('pool disagrees with the float64 reference: ')
  assert ' of 48 values differ, the largest by ' in message and 'at index (1, ' in message
  with pytest.raises(AssertionError, match=r'pool has shape \(2, 4, 2, 3\), the float64 .* \(4,'):
    testing.check_against_reference(pool, lambda x, mask: np.zeros(4), x, mask)
  with pytest.raises(AssertionError, match='output 1 of .*: the reference gives None'):
    testing.check_against_reference(
        lambda x, mask: mean.mean_pool(x, window=4, max_len=16, key_padding_mask=mask),
        lambda x, mask: (naive_window_means(x, mask, 4), None),
        x,
        mask,
    )


def test_the_checks_take_the_variables_given():
  config = config_of()
  variables = testing.random_variables(config, seed=3)
  nan = {**variables, 'params': {**variables['params'], 'mlm_bias': jnp.full((40,), jnp.nan)}}
  with pytest.raises(AssertionError, match='gives non-finite logits; give variables='):
    testing.check_padding_invariance(config, variables=nan)
