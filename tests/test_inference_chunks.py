"""Chunked inference (`config.model.inference_chunk`): same outputs, less memory."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import tiny_config
from run_helpers import typed
from test_models import SMALL  # the tiny model of the model-family tests

from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.inference_chunks import inference_chunk
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_config


def _logits(config: ModelConfig, variables, tokens, mask, deterministic=True):
  model = models.MaskedLanguageModel(config)
  rngs = None if deterministic else {'dropout': jax.random.PRNGKey(5)}
  return jax.jit(lambda v: model.apply(v, tokens, mask, deterministic=deterministic, rngs=rngs))(
      variables
  )


@pytest.mark.parametrize(
    'overrides',
    [
        dict(attention='full'),
        dict(attention='linformer', sharing='layerwise'),  # compress-then-project
        dict(attention='linformer', sharing='none'),  # per-head E, F: project, then compress
        dict(attention='linformer', sharing='headwise', projection='conv', pre_layer_norm=True),
    ],
    ids=['full', 'layerwise', 'none', 'conv-pre-ln'],
)
def test_chunked_inference_gives_the_same_logits_with_padding(overrides):
  config = ModelConfig(**{**SMALL, **overrides})
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 32), 1, 40)
  mask = jnp.arange(32)[None, :] < jnp.array([[32], [20], [7]])
  variables = nn.meta.unbox(models.MaskedLanguageModel(config).init(jax.random.PRNGKey(0), tokens))
  whole = _logits(config, variables, tokens, mask)
  chunked = ModelConfig(**{**SMALL, **overrides, 'inference_chunk': 12})  # chunks 12, 12, 8
  np.testing.assert_allclose(_logits(chunked, variables, tokens, mask), whole, rtol=1e-5, atol=1e-5)


def test_a_chunked_model_initialises_under_jit_as_without_chunks():
  # Initialisation creates parameters, which no chunk loop may do: a jitted
  # init once leaked a tracer from the MLP's bias inside the loop.
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 1, 40)
  whole = models.MaskedLanguageModel(ModelConfig(**SMALL))
  chunked = models.MaskedLanguageModel(ModelConfig(**{**SMALL, 'inference_chunk': 12}))
  expected = jax.jit(whole.init)(jax.random.PRNGKey(0), tokens)
  got = jax.jit(chunked.init)(jax.random.PRNGKey(0), tokens)
  jax.tree_util.tree_map(np.testing.assert_array_equal, nn.meta.unbox(got), nn.meta.unbox(expected))


def test_only_bidirectional_inference_passes_are_chunked():
  chunked = ModelConfig(**SMALL, inference_chunk=8)
  assert inference_chunk(chunked, 32, deterministic=True) == 8
  assert inference_chunk(chunked, 32, deterministic=False) is None  # training
  assert inference_chunk(chunked, 8, deterministic=True) is None  # one chunk is a pass
  causal = ModelConfig(**SMALL, inference_chunk=8, causal=True, block_len=8)
  assert inference_chunk(causal, 32, deterministic=True) is None
  assert inference_chunk(ModelConfig(**SMALL), 32, deterministic=True) is None


@pytest.mark.parametrize('attention', ['full', 'linformer'])
def test_chunks_shrink_the_compiled_temporaries(attention):
  """XLA's memory analysis of a forward pass at n = 1024: the attention scores
  [batch, heads, n, n or k] dominate one pass and shrink with the chunk."""
  settings = {**SMALL, 'max_len': 1024, 'projected_len': 64, 'attention': attention}
  tokens = jnp.ones((2, 1024), jnp.int32)
  variables = jax.eval_shape(
      models.MaskedLanguageModel(ModelConfig(**settings)).init, jax.random.PRNGKey(0), tokens
  )
  variables = nn.meta.unbox(variables)

  def temporaries(chunk):
    model = models.MaskedLanguageModel(ModelConfig(**settings, inference_chunk=chunk))
    forward = jax.jit(lambda v, t: model.apply(v, t, deterministic=True))
    return forward.lower(variables, tokens).compile().memory_analysis().temp_size_in_bytes

  whole, chunked = temporaries(0), temporaries(128)
  assert chunked < 0.5 * whole, (whole, chunked)


def test_a_negative_chunk_is_a_clear_error():
  with pytest.raises(ConfigError, match='inference_chunk'):
    ModelConfig(**SMALL, inference_chunk=-1)


def test_a_run_may_be_evaluated_with_another_chunk():
  saved = typed(tiny_config(**{'model.inference_chunk': 0})).to_dict()
  config = tiny_config(**{'model.inference_chunk': 256})
  run_config.check_same_model(saved, typed(config), 'runs/x')  # no error
  config.model.hidden_dim = 64
  with pytest.raises(ConfigError, match='hidden_dim=32'):
    run_config.check_same_model(saved, typed(config), 'runs/x')


@pytest.mark.parametrize('attention', ['full', 'linformer'])
def test_the_xla_kernel_of_jax_gives_the_same_logits(attention):
  """attention_kernel='xla' (jax.nn.dot_product_attention) against the einsums,
  with padding, in one pass and in chunks."""
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 1, 40)
  mask = jnp.arange(32)[None, :] < jnp.array([[32], [9]])
  config = ModelConfig(**SMALL, attention=attention)
  variables = nn.meta.unbox(models.MaskedLanguageModel(config).init(jax.random.PRNGKey(0), tokens))
  reference = _logits(config, variables, tokens, mask)
  for chunk in (0, 12):
    kernel = ModelConfig(
        **SMALL, attention=attention, attention_kernel='xla', inference_chunk=chunk
    )
    np.testing.assert_allclose(
        _logits(kernel, variables, tokens, mask), reference, rtol=1e-5, atol=1e-5
    )


def test_an_unknown_kernel_is_a_clear_error():
  with pytest.raises(ConfigError, match="attention_kernel='flash'.*'einsum', 'xla', 'cudnn'"):
    ModelConfig(**SMALL, attention_kernel='flash')
