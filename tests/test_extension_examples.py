"""The examples of parts with weights of their own: a projection whose slots are
learned convex mixes (docs/examples/convex_projection.py) and an attention kind
with a learned temperature per head and a setting
(docs/examples/tempered_attention.py). Their math against float64 loops, the
model's padding invariance, the causal pass's, and their gradients, through the
checks an author runs (`linformer_jax.testing`). tests/test_extending_walkthrough.py
trains them (the sweep of docs/extending.md)."""

import functools
import math

from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax import testing
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention_kinds
from linformer_jax.model import models
from linformer_jax.model import projections
from tests.run_helpers import small_model_config

CONVEX = 'docs/examples/convex_projection.py'
TEMPERED = 'docs/examples/tempered_attention.py'


@pytest.fixture(scope='module', autouse=True)
def examples():
  import_extensions([CONVEX, TEMPERED])


def random_variables(model, seed=0):
  """Random weights of a trained model's size (not init's near-uniform
  attention), every log-temperature a different value."""
  init = functools.partial(model.init, jax.random.PRNGKey(seed), jnp.ones((1, 16), jnp.int32))
  shapes = nn.meta.unbox(jax.eval_shape(init))
  leaves, tree = jax.tree_util.tree_flatten(shapes)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  leaves = [jax.random.normal(key, leaf.shape) * 0.5 for key, leaf in zip(keys, leaves)]
  return jax.tree_util.tree_unflatten(tree, leaves)


def naive_convex_mix(x, logits, mask):
  """Slot j of head h: sum over real positions p of softmax_p(L[p, j]) x[p, h]."""
  x, logits = np.asarray(x, np.float64), np.asarray(logits, np.float64)
  batch, length, heads, head_dim = x.shape
  k = logits.shape[-1]
  out = np.zeros((batch, k, heads, head_dim))
  for b in range(batch):
    real = [p for p in range(length) if mask[b, p]]
    for h in range(heads):
      matrix = logits[h] if logits.ndim == 3 else logits
      for j in range(k):
        weights = np.exp([matrix[p, j] for p in real])
        weights /= weights.sum()
        out[b, j, h] = sum(w * x[b, p, h] for w, p in zip(weights, real))
  return out


@pytest.mark.parametrize('per_head', [False, True])
def test_convex_mix_matches_a_float64_loop_on_a_short_padded_batch(per_head):
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 10, 3, 4))
  logits = jax.random.normal(jax.random.PRNGKey(2), ((3,) if per_head else ()) + (16, 5))
  # Shorter than max_len=16, with padding: rows 0..9 of E, real tokens only.
  mask = np.arange(10)[None] < np.array([[10], [6]])
  kind = projections.kind('convex')

  def compress(x, logits, mask):
    return kind.compress(x, logits, max_len=16, projected_len=5, key_padding_mask=mask)

  # The slots, and a slot mask all True: both rows hold real tokens.
  testing.check_against_reference(
      compress,
      lambda x, logits, mask: (naive_convex_mix(x, logits, mask), np.ones((2, 5), bool)),
      x,
      logits,
      mask,
  )


def test_padding_never_enters_a_slot_and_a_sequence_of_padding_has_no_slot():
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 8, 2, 4))
  logits = jax.random.normal(jax.random.PRNGKey(4), (16, 4))
  mask = jnp.arange(8)[None] < jnp.array([[5], [0]])
  kind = projections.kind('convex')
  mixed, slot_mask = kind.compress(x, logits, max_len=16, projected_len=4, key_padding_mask=mask)
  changed = x.at[:, 5:].set(1e6)  # other values in the padding only
  again, _ = kind.compress(changed, logits, max_len=16, projected_len=4, key_padding_mask=mask)
  np.testing.assert_array_equal(mixed[0], again[0])
  np.testing.assert_array_equal(slot_mask, [[True] * 4, [False] * 4])
  assert np.all(np.isfinite(again))


def naive_tempered_attention(q, keys, values, temperature):
  """softmax(q keys^T / (sqrt(d) t_h)) values, in float64, head by head."""
  q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
  logits = np.einsum('bqhd,bkhd->bhqk', q, keys) / math.sqrt(q.shape[-1])
  logits /= np.asarray(temperature, np.float64)[None, :, None, None]
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', weights, values)


def test_tempered_attention_matches_a_float64_reference():
  q, keys, values = jax.random.normal(jax.random.PRNGKey(5), (3, 2, 6, 2, 4))
  kind = attention_kinds.kind('tempered_linformer')

  def attend(q, keys, values, log_temperature):
    bound = kind.with_parameters({'log_temperature': log_temperature})
    return bound.attend(q, keys, values, None, kernel='einsum')

  def reference(q, keys, values, log_temperature):
    return naive_tempered_attention(q, keys, values, np.exp(log_temperature))

  testing.check_against_reference(
      attend, reference, q, keys[:, :3], values[:, :3], np.array([-0.7, 0.9])
  )


def log_temperatures(variables, value):
  """The variables with every log-temperature set to `value`."""
  flat = traverse_util.flatten_dict(variables)
  return traverse_util.unflatten_dict(
      {k: jnp.full_like(v, value) if k[-1] == 'log_temperature' else v for k, v in flat.items()}
  )


@pytest.mark.parametrize('causal', [False, True])
def test_a_temperature_of_one_is_the_linformer_and_another_is_not(causal):
  fields = dict(causal=causal, block_len=8, projection='mean' if causal else 'linear')
  model_class = models.CausalLanguageModel if causal else models.MaskedLanguageModel
  tempered = model_class(small_model_config(attention='tempered_linformer', **fields))
  variables = random_variables(tempered)
  flat = traverse_util.flatten_dict(variables)
  plain = traverse_util.unflatten_dict(
      {k: v for k, v in flat.items() if k[-1] != 'log_temperature'}
  )
  tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 16), 0, 40)
  linformer = model_class(small_model_config(attention='linformer', **fields))
  apply = jax.jit(tempered.apply)
  at_one = apply(log_temperatures(variables, 0.0), tokens)
  np.testing.assert_allclose(at_one, jax.jit(linformer.apply)(plain, tokens), rtol=1e-5, atol=1e-5)
  at_two = apply(log_temperatures(variables, math.log(2.0)), tokens)
  assert not np.allclose(at_two, at_one, atol=1e-3)


@pytest.mark.slow
def test_tempered_decoding_gives_the_logits_of_the_causal_pass():
  config = small_model_config(
      attention='tempered_linformer', projection='mean', causal=True, block_len=4
  )
  model = models.CausalLanguageModel(config)
  variables = random_variables(model)
  tokens = jax.random.randint(jax.random.PRNGKey(9), (2, 9), 0, 40)
  full = np.asarray(jax.jit(model.apply)(variables, tokens))
  init_cache = lambda token: model.init(jax.random.PRNGKey(1), token, decode=True)['cache']
  cache = jax.jit(init_cache)(tokens[:, :1])

  @jax.jit
  def step(cache, token):
    logits, updated = model.apply(
        {**variables, 'cache': cache}, token, decode=True, mutable=['cache']
    )
    return logits, updated['cache']

  for t in range(tokens.shape[1]):  # crosses two block boundaries (b = 4)
    logits, cache = step(cache, tokens[:, t : t + 1])
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    'attention,projection,sharing',
    [
        ('linformer', 'convex', 'none'),
        ('tempered_linformer', 'linear', 'headwise'),
        pytest.param('tempered_linformer', 'convex', 'layerwise', marks=pytest.mark.slow),
    ],
)
def test_model_output_with_an_example_is_padding_invariant(attention, projection, sharing):
  testing.check_padding_invariance(
      testing.small_config(attention=attention, projection=projection, sharing=sharing)
  )


def test_the_causal_tempered_attention_sees_no_later_token():
  testing.check_no_causal_leakage(
      testing.small_config(attention='tempered_linformer', projection='mean', causal=True)
  )


def test_the_mix_and_the_temperature_get_nonzero_gradients():
  config = small_model_config(attention='tempered_linformer', projection='convex', sharing='kv')
  model = models.MaskedLanguageModel(config)
  variables = random_variables(model)
  tokens = jax.random.randint(jax.random.PRNGKey(8), (2, 16), 0, 40)

  def loss(params):
    logits = model.apply({'params': params}, tokens)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

  grads = jax.jit(jax.grad(loss))(variables['params'])['encoder']
  for layer in ('layers_0', 'layers_1'):
    attention = grads[layer]['attention']
    assert float(jnp.abs(attention['log_temperature']).min()) > 0
    assert float(jnp.abs(attention['projection']['kv_projection']).max()) > 0
