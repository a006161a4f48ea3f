"""The classifier's pooling: `first`, `mean` and the learned `attention` query.

Each pooling is checked against a float64 NumPy reference and for padding
invariance (a sequence alone, batched, and padded to any length gives the same
logits). The `first` and `mean` heads keep their parameters and outputs, so
fine-tuning checkpoints written before `attention` existed load unchanged.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig

POOLINGS = ('first', 'mean', 'attention')


def small_config(**overrides):
  fields = dict(
      vocab_size=40,
      max_len=32,
      num_layers=2,
      num_heads=2,
      hidden_dim=16,
      mlp_dim=32,
      projected_len=8,
      sharing='none',
      dropout_rate=0.0,
  )
  fields.update(overrides)
  return ModelConfig(**fields)


def init_classifier(config, num_classes=3):
  model = models.SequenceClassifier(config, num_classes=num_classes)
  tokens = jnp.ones((1, config.max_len), jnp.int32)
  variables = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens))
  if config.pooling == 'attention':
    # A query that prefers some tokens, so the test is not mean pooling.
    query = jax.random.normal(jax.random.PRNGKey(1), (config.hidden_dim,)) * 3.0
    variables['params']['pool_query'] = query
  return model, variables


def reference_pool(hidden, mask, pooling, query=None):
  """Float64 NumPy pooling of [batch, len, d] with a boolean [batch, len] mask."""
  hidden = np.asarray(hidden, np.float64)
  mask = np.asarray(mask, bool)
  if pooling == 'first':
    return hidden[:, 0]
  if pooling == 'mean':
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  scores = hidden @ np.asarray(query, np.float64) / np.sqrt(hidden.shape[-1])
  scores = np.where(mask, scores, -np.inf)
  weights = np.exp(scores - scores.max(1, keepdims=True))
  weights /= weights.sum(1, keepdims=True)
  return np.einsum('bl,bld->bd', weights, hidden)


def test_pooling_functions_match_a_float64_reference():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(3, 10, 8)).astype(np.float32)
  mask = np.arange(10)[None] < np.array([[10], [4], [1]])
  query = rng.normal(size=8).astype(np.float32) * 2
  np.testing.assert_allclose(
      models.mean_pool(jnp.asarray(hidden), jnp.asarray(mask)),
      reference_pool(hidden, mask, 'mean'),
      rtol=1e-5,
      atol=1e-6,
  )
  np.testing.assert_allclose(
      models.attention_pool(jnp.asarray(hidden), jnp.asarray(mask), jnp.asarray(query)),
      reference_pool(hidden, mask, 'attention', query),
      rtol=1e-5,
      atol=1e-6,
  )


def test_a_zero_query_is_mean_pooling():
  hidden = jax.random.normal(jax.random.PRNGKey(0), (2, 7, 8))
  mask = jnp.arange(7)[None] < jnp.array([[7], [3]])
  np.testing.assert_allclose(
      models.attention_pool(hidden, mask, jnp.zeros(8)),
      models.mean_pool(hidden, mask),
      rtol=1e-6,
      atol=1e-6,
  )


@pytest.mark.parametrize('attention', ['linformer', 'full'])
@pytest.mark.parametrize('pooling', POOLINGS)
def test_every_pooling_is_padding_invariant(attention, pooling):
  config = small_config(attention=attention, pooling=pooling)
  model, variables = init_classifier(config)
  apply = jax.jit(model.apply)
  real_len = 11
  tokens = jax.random.randint(jax.random.PRNGKey(3), (3, 32), 3, config.vocab_size)
  alone = apply(variables, tokens[:1, :real_len])[0]
  for padded_len in (real_len, 27, 32):
    mask = jnp.arange(padded_len)[None] < jnp.array([[real_len], [padded_len], [padded_len]])
    batch_tokens = jnp.where(mask, tokens[:, :padded_len], 0)
    batched = apply(variables, batch_tokens, mask)[0]
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('pooling', POOLINGS)
def test_the_head_reads_the_pooled_encoder_output(pooling):
  """Logits are dense(tanh(dense(pool(encoder output)))), the head's only
  parameters being its two dense layers (and the query for `attention`)."""
  config = small_config(pooling=pooling)
  model, variables = init_classifier(config)
  params = variables['params']
  expected_names = {'encoder', 'classifier_dense', 'classifier_out'}
  assert set(params) == expected_names | ({'pool_query'} if pooling == 'attention' else set())
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 20), 3, config.vocab_size)
  mask = jnp.arange(20)[None] < jnp.array([[20], [9]])
  logits = model.apply(variables, tokens, mask)
  hidden = models.Encoder(config).apply(
      {
          'params': params['encoder'],
          **{k: v['encoder'] for k, v in variables.items() if k != 'params'},
      },
      tokens,
      mask,
  )
  pooled = reference_pool(hidden, mask, pooling, params.get('pool_query'))
  dense, out = params['classifier_dense'], params['classifier_out']
  h = np.tanh(pooled @ np.asarray(dense['kernel'], np.float64) + np.asarray(dense['bias']))
  expected = h @ np.asarray(out['kernel'], np.float64) + np.asarray(out['bias'])
  np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_the_query_starts_at_zero_and_learns():
  config = small_config(pooling='attention')
  model = models.SequenceClassifier(config, num_classes=2)
  tokens = jax.random.randint(jax.random.PRNGKey(5), (4, 16), 3, config.vocab_size)
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), tokens))
  assert not np.any(variables['params']['pool_query'])

  def loss(params):
    logits = model.apply({**variables, 'params': params}, tokens)
    return -jax.nn.log_softmax(logits)[:, 0].mean()

  gradient = jax.jit(jax.grad(loss))(variables['params'])['pool_query']
  assert float(jnp.abs(gradient).max()) > 0
