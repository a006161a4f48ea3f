"""`AttentionKind.attention_weights`, the P that analyses read.

For every built-in kind P V is its `attend`'s output, padded keys weigh
nothing and dropout never enters; in a model, the P that `attention_capture`
reads for each layer, with the layer's own parameters and constants, gives
the layer's attention output; the tempered example overrides it, and a kind
that overrides `attend` alone, or records no keys, is refused in one line.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention
from linformer_jax.model import attention_capture
from linformer_jax.model import attention_kinds
from linformer_jax.model import models
from tests.run_helpers import small_model_config

TEMPERED = 'docs/examples/tempered_attention.py'
SCALED = 'docs/examples/scaled_linformer.py'
BATCH, LENGTH, HEADS, HEAD_DIM = 2, 16, 2, 4
PROJECTED = 4  # small_model_config's k
# Settings small enough that every kind's pattern, landmarks or buckets
# matter at n = 16; the value convolution makes Nystromformer's P more than
# its three factors.
SETUPS = {
    'full': ('full', {}),
    'linformer': ('linformer', {}),
    'linear_transformer': ('linear_transformer', {}),
    'performer': ('performer', {'performer_features': 8}),
    'nystromformer': ('nystromformer', {'nystrom_landmarks': 4, 'nystrom_conv_kernel': 3}),
    'reformer': ('reformer', {'reformer_bucket_size': 4, 'reformer_n_hashes': 2}),
    'longformer': ('longformer', {'longformer_window': 4, 'longformer_global_tokens': 1}),
    'bigbird': ('bigbird', {'bigbird_block_size': 4, 'bigbird_random_blocks': 1}),
    'sparse_fixed': ('sparse_transformer', {'sparse_block_size': 4, 'sparse_summary_size': 2}),
    'sparse_strided': ('sparse_transformer', {'sparse_pattern': 'strided', 'sparse_block_size': 4}),
}


def config_of(setup, **overrides):
  kind, settings = SETUPS[setup]
  return small_model_config(attention=kind, extension_settings=settings, **overrides)


def bound_kind(config, seed=0):
  """The configured kind with its config and random parameters and constants
  bound, as a layer binds them."""
  kind = config.attention_kind
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 8))
  draw = lambda declared: {
      name: part.init(next(keys), part.shape, jnp.float32) for name, part in declared.items()
  }
  params, constants = draw(kind.parameters(config)), draw(kind.constants(config))
  return kind.with_config(config).with_parameters(params).with_constants(constants)


def holey_mask(length):
  """Example 0 right-padded after 11 tokens; example 1 with two padded
  positions first, a hole at 6, right-padded after 13."""
  mask = np.ones((BATCH, length), bool)
  mask[0, 11:] = False
  mask[1, :2] = False
  mask[1, 6] = False
  mask[1, 13:] = False
  return jnp.asarray(mask)


def inputs_of(kind, seed=1):
  """q, keys, values and key mask as the kind's `attend` receives them: the k
  compressed keys for the Linformer, the values in the keys' place for the
  Reformer; padded values large, so that any weight on them shows."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  kv_length = PROJECTED if kind.uses_projection else LENGTH
  q = jax.random.normal(keys[0], (BATCH, LENGTH, HEADS, HEAD_DIM), jnp.float32)
  k, v = (jax.random.normal(key, (BATCH, kv_length, HEADS, HEAD_DIM)) for key in keys[1:])
  key_mask = (
      holey_mask(kv_length)
      if kv_length == LENGTH
      else jnp.array([[1, 1, 1, 1], [1, 1, 0, 1]], bool)
  )
  v = jnp.where(key_mask[:, :, None, None], v, 1e3)
  if kind.name == 'reformer':
    k = v
  return q, k, v, key_mask


@pytest.mark.parametrize('setup', sorted(SETUPS))
def test_p_times_the_values_is_what_attend_computes(setup):
  kind = bound_kind(config_of(setup))
  q, keys, values, key_mask = inputs_of(kind)
  weights = jax.jit(kind.attention_weights)(q, keys, values, key_mask)
  assert weights.dtype == jnp.float32
  assert weights.shape == (BATCH, HEADS, LENGTH, keys.shape[1])
  out = jax.jit(lambda *args: kind.attend(*args, kernel='einsum'))(q, keys, values, key_mask)
  np.testing.assert_allclose(
      jnp.einsum('bhqk,bkhd->bqhd', weights, values, precision='highest'),
      out,
      rtol=1e-5,
      atol=1e-5,
  )
  # A padded key weighs nothing for any query.
  padded = ~np.asarray(key_mask)[:, None, None, :]
  assert np.all(np.where(padded, np.asarray(weights), 0.0) == 0.0)


@pytest.mark.parametrize('setup', ['full', 'linformer'])
def test_p_is_evaluations_whatever_dropout_the_kind_holds(setup):
  kind = bound_kind(config_of(setup, attention_dropout_rate=0.5))
  q, keys, values, key_mask = inputs_of(kind)
  dropping = kind.with_weight_dropout(attention.WeightDropout(0.5, jax.random.PRNGKey(3)))
  np.testing.assert_array_equal(
      dropping.attention_weights(q, keys, values, key_mask),
      kind.attention_weights(q, keys, values, key_mask),
  )
  # Softmax rows: each query's weights sum to 1 over the keys it may see.
  rows = kind.attention_weights(q, keys, values, key_mask).sum(-1)
  np.testing.assert_allclose(rows, 1.0, rtol=1e-6)


def tempered_config(**overrides):
  import_extensions([TEMPERED])
  return small_model_config(
      attention='tempered_linformer', extension_settings={'temperature_init': 2.0}, **overrides
  )


def test_the_tempered_kind_gives_the_softmax_of_its_tempered_queries():
  kind = bound_kind(tempered_config())
  temperature = np.exp(np.asarray(kind.params['log_temperature'], np.float64))
  assert np.allclose(temperature, 2.0)
  q, keys, values, key_mask = inputs_of(kind)
  expected = attention_capture.attention_matrix(
      np.asarray(q, np.float64) / temperature[:, None], keys, key_mask
  )
  np.testing.assert_allclose(
      kind.attention_weights(q, keys, values, key_mask), expected, rtol=1e-5, atol=1e-7
  )
  out = kind.attend(q, keys, values, key_mask, kernel='einsum')
  np.testing.assert_allclose(
      np.einsum('bhqk,bkhd->bqhd', expected, values), out, rtol=1e-5, atol=1e-5
  )


def captures_with_outputs(module, method_name):
  return attention_capture.capture_intermediates(module, method_name) or (
      method_name == '__call__' and module.name == 'out'
  )


# One kind of each way of binding and recording: compressed keys, constants,
# parameters, shared queries and keys, per-example patterns, a kind of one's own.
@pytest.mark.parametrize(
    'setup', ['linformer', 'performer', 'nystromformer', 'reformer', 'bigbird', 'tempered']
)
def test_the_p_analyses_read_gives_each_layers_attention_output(setup):
  config = tempered_config() if setup == 'tempered' else config_of(setup)
  attention_capture.require_attention_weights(config, 'this test')
  model = models.MaskedLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (BATCH, LENGTH), 0, config.vocab_size)
  padding_mask = holey_mask(LENGTH)
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(5), tokens, padding_mask))

  @jax.jit
  def capture(variables):
    _, state = model.apply(
        variables,
        tokens,
        padding_mask,
        capture_intermediates=captures_with_outputs,
        mutable=['intermediates'],
    )
    return state['intermediates']

  intermediates = capture(variables)
  for layer, attended in enumerate(attention_capture.attended_by_layer(intermediates, config)):
    weights = attention_capture.layer_attention_weights(variables, config, layer, attended)
    assert weights.dtype == np.float64
    mixed = np.einsum('bhqk,bkhd->bqhd', weights, np.asarray(attended.values, np.float64))
    out_dense = variables['params']['encoder'][f'layers_{layer}']['attention']['out']
    expected = np.einsum('bqhd,hde->bqe', mixed, out_dense['kernel']) + out_dense['bias']
    actual = intermediates['encoder'][f'layers_{layer}']['attention']['out']['__call__'][0]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5, err_msg=f'layer {layer}')
    masked = attention_capture.layer_attention_weights(
        variables, config, layer, attended, padding_mask
    )
    # With the padding mask, padded queries' rows are zero and the rest unchanged.
    real_queries = np.asarray(padding_mask)[:, None, :, None]
    np.testing.assert_array_equal(masked, np.where(real_queries, weights, 0.0))


def test_a_kind_that_overrides_attend_alone_is_refused_in_one_line():
  import_extensions([SCALED])
  with pytest.raises(ConfigError) as error:
    attention_capture.require_attention_weights(
        small_model_config(attention='scaled_linformer'), 'spectrum'
    )
  message = str(error.value)
  assert "attention='scaled_linformer' weighs its keys its own way" in message
  assert 'ScaledLinformer overrides attend' in message and 'define attention_weights' in message
  assert '\n' not in message
  with pytest.raises(ConfigError, match='causal'):
    attention_capture.require_attention_weights(config_of('full', causal=True), 'spectrum')
  for setup in SETUPS:
    attention_capture.require_attention_weights(config_of(setup), 'spectrum')


@attention_kinds.REGISTRY.register('unrecorded_keys')
class UnrecordedKeys(attention_kinds.AttentionKind):
  """Keys of its own that it never records for analyses."""

  def keys_and_values(self, x, padding_mask, dense, projection, config, *, compress_first, record):
    del projection, config, compress_first, record
    return 2.0 * dense.keys(x), dense.values(x), padding_mask


def test_a_kind_that_records_no_keys_is_one_line_naming_record():
  config = small_model_config(attention='unrecorded_keys', num_layers=1)
  model = models.MaskedLanguageModel(config)
  tokens = jnp.ones((1, LENGTH), jnp.int32)
  variables = model.init(jax.random.PRNGKey(0), tokens)
  intermediates = attention_capture.apply_capturing(model, variables, tokens, tokens > 0)
  with pytest.raises(ConfigError) as error:
    attention_capture.attended_by_layer(intermediates, config)
  message = str(error.value)
  assert "attention='unrecorded_keys' records nothing" in message and "record('attended'" in message
  assert '\n' not in message
