"""How the learned projection matrices start (`config.model.projection_init`)."""

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_models import SMALL  # the tiny model of the model-family tests
from test_models import init_variables
from test_models import random_tokens
from test_models import small_config

from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model import projections
from linformer_jax.model.model_config import ModelConfig


def projection_weights(variables):
  """The E/F weights of a model, by their parameter path."""
  flat = traverse_util.flatten_dict(variables['params'], sep='/')
  return {path: weight for path, weight in flat.items() if path.endswith('projection')}


def naive_window_means(x, span, projected_len):
  """float64 mean of each window of span / k positions, windows restarting every span."""
  x = np.asarray(x, np.float64)
  batch, length, heads, head_dim = x.shape
  window = span // projected_len
  return x.reshape(batch, length // window, window, heads, head_dim).mean(axis=2)


@pytest.mark.parametrize(
    'overrides',
    [
        dict(sharing='layerwise'),
        dict(sharing='none'),
        dict(sharing='headwise', projected_len=(8, 4)),
        dict(sharing='none', causal=True, block_len=16, projected_len=4),
    ],
)
def test_local_starts_as_the_mean_projection(overrides):
  config = small_config(projection_init='local', **overrides)
  weights = projection_weights(init_variables(models.MaskedLanguageModel(config)))
  assert weights
  x = jax.random.normal(jax.random.PRNGKey(1), (2, SMALL['max_len'], 4, 4))
  linear, mean = projections.kind('linear'), projections.kind('mean')
  for weight in weights.values():
    k = weight.shape[-1]
    expected = naive_window_means(x, config.compressed_span, k)
    if config.causal:  # block i's r slots: the causal form of both
      blocks = dict(block=config.block_len, slots=k, key_padding_mask=jnp.ones(x.shape[:2], bool))
      projected, _ = linear.block_summaries(x, weight, **blocks)
      pooled, _ = mean.block_summaries(x, None, **blocks)
    else:
      common = dict(max_len=SMALL['max_len'], projected_len=k)
      projected, _ = linear.compress(x, weight, **common)
      pooled, _ = mean.compress(x, None, **common)
    np.testing.assert_allclose(projected, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pooled, expected, rtol=1e-6, atol=1e-6)


def test_local_sums_a_padded_window_over_its_length_where_mean_averages():
  """The one case `local` and `mean` part: E is fixed, so padding counts as zero."""
  config = small_config(projection_init='local', sharing='kv')
  weight = projection_weights(init_variables(models.MaskedLanguageModel(config)))
  weight = weight['encoder/layers_0/attention/projection/kv_projection']
  # Windows of 4 positions; the third holds 2 real tokens, then 2 padded (garbage) ones.
  x = jax.random.normal(jax.random.PRNGKey(2), (1, 12, 4, 4)).at[:, 10:].set(1e3)
  mask = jnp.arange(12)[None] < 10
  projected, _ = projections.kind('linear').compress(
      x, weight, max_len=SMALL['max_len'], projected_len=8, key_padding_mask=mask
  )
  padded = np.zeros((1, SMALL['max_len'], 4, 4))
  padded[:, :10] = x[:, :10]
  np.testing.assert_allclose(projected, naive_window_means(padded, 32, 8), rtol=1e-6, atol=1e-6)
  pooled, pooled_mask = projections.kind('mean').compress(
      x, None, max_len=SMALL['max_len'], projected_len=8, key_padding_mask=mask
  )
  np.testing.assert_allclose(pooled[:, 2], np.asarray(x[:, 8:10], np.float64).mean(axis=1), 1e-6)
  assert pooled_mask[0].tolist() == [True] * 3 + [False] * 5


def test_local_model_computes_as_the_mean_model_before_training():
  local = models.MaskedLanguageModel(small_config(projection_init='local'))
  variables = init_variables(local)
  mean_params = init_variables(models.MaskedLanguageModel(small_config(projection='mean')))
  without_projection = traverse_util.flatten_dict(variables['params'], sep='/')
  del without_projection['encoder/shared_projection/kv_projection']
  mean_flat = traverse_util.flatten_dict(mean_params['params'], sep='/')
  assert jax.tree.all(jax.tree.map(np.array_equal, without_projection, mean_flat))
  tokens = random_tokens(2, 2, SMALL['max_len'])
  np.testing.assert_allclose(
      local.apply(variables, tokens),
      models.MaskedLanguageModel(small_config(projection='mean')).apply(mean_params, tokens),
      rtol=1e-5,
      atol=1e-5,
  )


def test_local_noise_has_the_asked_stddev():
  common = dict(max_len=512, projected_len=64, sharing='kv', projection_init='local')
  exact = projection_weights(init_variables(models.MaskedLanguageModel(small_config(**common))))
  noisy = small_config(projection_init_noise=0.05, **common)
  noisy = projection_weights(init_variables(models.MaskedLanguageModel(noisy)))
  for path, weight in noisy.items():
    np.testing.assert_allclose(float(jnp.std(weight - exact[path])), 0.05, rtol=0.02)


@pytest.mark.parametrize('sharing', ['none', 'kv'])
def test_xavier_is_uniform_with_the_glorot_limit_per_matrix(sharing):
  config = small_config(max_len=1024, projected_len=256, projection_init='xavier', sharing=sharing)
  limit = (6 / (1024 + 256)) ** 0.5  # the heads axis of a per-head weight is no fan
  weight = next(
      iter(projection_weights(init_variables(models.MaskedLanguageModel(config))).values())
  )
  assert float(jnp.max(jnp.abs(weight))) <= limit
  assert float(jnp.max(jnp.abs(weight))) > 0.999 * limit
  np.testing.assert_allclose(float(jnp.var(weight)), limit**2 / 3, rtol=0.02)
  if sharing == 'none':
    assert not np.array_equal(weight[0], weight[1])  # each head draws its own matrix


def test_fairseq_is_glorot_uniform_with_gain_one_over_root_two():
  config = small_config(max_len=1024, projected_len=64, projection_init='fairseq', sharing='kv')
  limit = (3 / (1024 + 64)) ** 0.5  # gain^2 = 1/2 of Glorot's 6 / (fan_in + fan_out)
  weight = next(
      iter(projection_weights(init_variables(models.MaskedLanguageModel(config))).values())
  )
  assert 0.999 * limit < float(jnp.max(jnp.abs(weight))) <= limit
  np.testing.assert_allclose(float(jnp.var(weight)), 1 / (1024 + 64), rtol=0.03)
  # A slot of E^T x keeps about one row's norm, where jl's grows as sqrt(n / k).
  np.testing.assert_allclose(float(jnp.mean(jnp.sum(weight**2, axis=0))), 1024 / 1088, rtol=0.03)


def test_jl_draws_the_same_values_as_before_the_choice_existed():
  """Pinned entries of E under seed 0: runs and checkpoints from before keep them bit for bit."""
  for config in (small_config(sharing='kv'), small_config(sharing='kv', projection_init='jl')):
    e = projection_weights(init_variables(models.MaskedLanguageModel(config)))
    kv = e['encoder/layers_0/attention/projection/kv_projection']
    expected = [-0.5011552572250366, -0.05245969071984291, 0.3105919659137726, -0.53480464220047]
    np.testing.assert_array_equal(kv[0, :4], np.float32(expected))
  per_head = projection_weights(
      init_variables(models.MaskedLanguageModel(small_config(sharing='none')))
  )
  value = per_head['encoder/layers_1/attention/projection/value_projection']
  expected = [0.2565901577472687, 0.2744879722595215, -0.45808371901512146]
  np.testing.assert_array_equal(value[3, 0, :3], np.float32(expected))


@pytest.mark.parametrize(
    'projection_init,noise,sharing',
    [
        ('jl', 0.0, 'none'),
        ('local', 0.0, 'none'),
        ('local', 0.1, 'none'),
        ('local', 0.0, 'layerwise'),
        ('xavier', 0.0, 'none'),
        ('xavier', 0.0, 'kv'),
        ('fairseq', 0.0, 'none'),
    ],
)
def test_padding_never_enters_the_output_for_any_init(projection_init, noise, sharing):
  """An example's output is the same alone or batched with longer, padded ones."""
  config = small_config(
      projection_init=projection_init, projection_init_noise=noise, sharing=sharing
  )
  model = models.MaskedLanguageModel(config)
  variables = init_variables(model)
  apply = jax.jit(model.apply)
  real_len = 11
  tokens = random_tokens(3, 3, SMALL['max_len'])
  alone = apply(variables, tokens[:1, :real_len])[0]
  for padded_len in (real_len, 27, SMALL['max_len']):
    mask = jnp.arange(padded_len)[None] < jnp.array([[real_len], [padded_len], [padded_len]])
    batch_tokens = jnp.where(mask, tokens[:, :padded_len], 5)
    batched = apply(variables, batch_tokens, mask)[0, :real_len]
    np.testing.assert_allclose(batched, alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    'overrides,field,allowed',
    [
        (
            dict(projection_init='orthogonal'),
            'projection_init',
            "('jl', 'local', 'xavier', 'fairseq')",
        ),
        (dict(projection='mean', projection_init='local'), 'projection_init', "('jl',)"),
        (dict(projection='random', projection_init='xavier'), 'projection_init', "('jl',)"),
        (dict(projection_init='local', projected_len=12), 'projection_init', '32 % 12'),
        (
            dict(projection_init='local', causal=True, block_len=16, projected_len=6),
            'projection_init',
            'block_len=16',
        ),
        (dict(projection_init_noise=0.1), 'projection_init_noise', "projection_init='local'"),
        (
            dict(projection_init='local', projection_init_noise=-1.0),
            'projection_init_noise',
            '>= 0',
        ),
    ],
)
def test_a_bad_projection_init_is_a_one_line_config_error(overrides, field, allowed):
  with pytest.raises(ConfigError, match=f'config.model.{field}=') as error:
    ModelConfig(**{**SMALL, **overrides})
  message = str(error.value)
  assert '\n' not in message and 'allowed' in message and allowed in message


@pytest.mark.parametrize(
    'projection,resolved', [('linear', 'local'), ('random', 'jl'), ('mean', 'jl'), ('conv', 'jl')]
)
def test_the_default_init_is_each_kinds_own(projection, resolved):
  """configs/default.py's projection_init='' is 'local' for the learned E (with its
  updates centred, docs/results_gutenberg.md) and leaves every other kind valid."""
  assert small_config(projection=projection, projection_init='').projection_init == resolved


def test_the_default_config_trains_a_local_centred_e_and_the_paper_is_one_setting_away():
  from configs import default  # pylint: disable=g-import-not-at-top

  config = default.get_config()
  assert config.projection_remove_common_update is True
  assert ModelConfig.from_config(config.model).projection_init == 'local'
  config.model.projection_init = 'jl'  # the paper's draw
  assert ModelConfig.from_config(config.model).projection_init == 'jl'


def test_a_k_that_does_not_divide_n_names_the_way_out_of_the_default():
  with pytest.raises(ConfigError, match="or projection_init='jl'"):
    small_config(projection_init='', projected_len=12)
