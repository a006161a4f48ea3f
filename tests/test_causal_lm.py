"""The causal language model: no position sees a later one, and decoding
token by token with the cache gives the full forward pass's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig

VOCAB, MAX_LEN = 23, 16


def causal_config(**overrides) -> ModelConfig:
  fields = dict(
      vocab_size=VOCAB,
      max_len=MAX_LEN,
      num_layers=2,
      num_heads=2,
      hidden_dim=8,
      mlp_dim=16,
      projected_len=2,
      block_len=4,
      causal=True,
      pre_layer_norm=True,
      dropout_rate=0.0,
  )
  fields.update(overrides)
  return ModelConfig(**fields)


VARIANTS = {
    'transformer': dict(attention='full'),
    'linear-layerwise': dict(),
    'linear-none': dict(sharing='none'),
    'random-kv': dict(projection='random', sharing='kv'),
    'mean-headwise': dict(projection='mean', sharing='headwise'),
    'max-layerwise': dict(projection='max'),
    'conv-none': dict(projection='conv', sharing='none'),
    'per-layer-r': dict(sharing='headwise', projected_len=(2, 4)),
}


def tokens_and_model(variant, length=13, seed=0):
  config = causal_config(**VARIANTS[variant])
  model = models.CausalLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(seed), (2, length), 1, VOCAB)
  variables = jax.jit(model.init)(jax.random.PRNGKey(1), tokens)
  return config, model, variables, tokens


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_changing_later_tokens_changes_no_earlier_logit(variant):
  _, model, variables, tokens = tokens_and_model(variant)
  apply = jax.jit(model.apply)
  logits = np.asarray(apply(variables, tokens))
  for t in (0, 3, 4, 7, 9):  # inside blocks and on their edges (b = 4)
    changed = np.asarray(apply(variables, tokens.at[:, t + 1 :].add(5) % VOCAB))
    np.testing.assert_array_equal(changed[:, : t + 1], logits[:, : t + 1])
    assert not np.array_equal(changed[:, t + 1 :], logits[:, t + 1 :])


@pytest.mark.parametrize('variant', ['transformer', 'linear-none', 'max-layerwise', 'conv-none'])
def test_decoding_with_the_cache_gives_the_full_forward_logits(variant):
  _, model, variables, tokens = tokens_and_model(variant, length=11)
  full = np.asarray(jax.jit(model.apply)(variables, tokens))
  init_cache = lambda token: model.init(jax.random.PRNGKey(1), token, decode=True)['cache']
  cache = jax.jit(init_cache)(tokens[:, :1])
  params = {name: value for name, value in variables.items() if name != 'cache'}

  @jax.jit
  def step(cache, token):
    logits, updated = model.apply({**params, 'cache': cache}, token, decode=True, mutable=['cache'])
    return logits, updated['cache']

  for t in range(tokens.shape[1]):  # crosses two block boundaries (b = 4)
    logits, cache = step(cache, tokens[:, t : t + 1])
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
  assert int(cache['position']) == tokens.shape[1]


def test_right_padding_leaves_the_real_positions_unchanged():
  _, model, variables, tokens = tokens_and_model('linear-layerwise', length=9)
  apply = jax.jit(model.apply)
  alone = apply(variables, tokens[:1])
  padded = jnp.concatenate([tokens[:1], jnp.zeros((1, 5), tokens.dtype)], axis=1)
  mask = jnp.arange(14)[None] < 9
  np.testing.assert_allclose(apply(variables, padded, mask)[:, :9], alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    'overrides, message',
    [
        (dict(block_len=5), 'block_len=5 .* divide max_len=16'),
        (dict(projected_len=8), 'k must be at most block_len=4'),
        (dict(projection='mean', projected_len=3), 'block_len=4 to be a multiple of k'),
        (dict(causal='yes'), 'causal'),
    ],
)
def test_bad_causal_settings_name_the_field(overrides, message):
  with pytest.raises(ConfigError, match=message):
    causal_config(**overrides)


def test_a_bidirectional_model_refuses_to_decode():
  config = causal_config(causal=False)
  with pytest.raises(ValueError, match='causal=True'):
    models.CausalLanguageModel(config).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
