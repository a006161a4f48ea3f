"""The Flax model family: sharing counts, gradients, invariances, compilation, errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from linformer_jax.model import layers
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig

SMALL = dict(
    vocab_size=40,
    max_len=32,
    num_layers=2,
    num_heads=4,
    hidden_dim=16,
    mlp_dim=32,
    projected_len=8,
    dropout_rate=0.0,
)


def small_config(**overrides):
  return ModelConfig(**{**SMALL, **overrides})


def init_variables(model, length=SMALL['max_len'], batch=2, seed=0):
  tokens = jnp.ones((batch, length), jnp.int32)
  return nn.meta.unbox(model.init(jax.random.PRNGKey(seed), tokens))


def random_tokens(seed, batch, length, vocab=SMALL['vocab_size']):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0, vocab)


@pytest.mark.parametrize(
    'sharing,expected', [('none', 288), ('headwise', 24), ('kv', 12), ('layerwise', 1)]
)
@pytest.mark.parametrize('projection', ['linear', 'random', 'conv'])
def test_projection_matrix_counts_for_a_12_layer_12_head_model(sharing, expected, projection):
  config = ModelConfig(
      vocab_size=64,
      max_len=512,
      num_layers=12,
      num_heads=12,
      hidden_dim=96,
      mlp_dim=64,
      projected_len=128,
      sharing=sharing,
      projection=projection,
  )
  shapes = jax.eval_shape(
      models.MaskedLanguageModel(config).init, jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32)
  )
  assert models.count_projection_matrices(shapes, config) == expected


def test_pooling_has_no_projection_weights():
  config = small_config(projection='mean')
  variables = init_variables(models.MaskedLanguageModel(config))
  assert models.count_projection_matrices(variables, config) == 0


@pytest.mark.parametrize('sharing', ['none', 'headwise'])
def test_projected_len_per_layer(sharing):
  config = small_config(projected_len=(8, 4), sharing=sharing)
  variables = init_variables(models.MaskedLanguageModel(config))
  layers = variables['params']['encoder']
  for layer, k in ((0, 8), (1, 4)):
    projection = layers[f'layers_{layer}']['attention']['projection']
    assert projection['key_projection'].shape[-2:] == (32, k)
    assert projection['value_projection'].shape[-2:] == (32, k)


def test_learned_projections_start_as_the_jl_construction():
  config = ModelConfig(
      vocab_size=8,
      max_len=1024,
      num_layers=1,
      num_heads=1,
      hidden_dim=4,
      mlp_dim=4,
      projected_len=256,
      sharing='kv',
  )
  variables = init_variables(models.MaskedLanguageModel(config), length=4)
  e = variables['params']['encoder']['layers_0']['attention']['projection']['kv_projection']
  assert abs(float(jnp.mean(e))) < 3e-3
  np.testing.assert_allclose(float(jnp.var(e)), 1 / 256, rtol=0.02)


def mlm_loss(model, params, other_variables, tokens):
  logits = model.apply({'params': params, **other_variables}, tokens)
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()


@pytest.mark.parametrize('sharing', ['none', 'headwise', 'kv', 'layerwise'])
@pytest.mark.parametrize('projection', ['linear', 'conv'])
def test_every_learned_projection_gets_a_nonzero_gradient(sharing, projection):
  config = small_config(sharing=sharing, projection=projection)
  model = models.MaskedLanguageModel(config)
  variables = init_variables(model)
  params = variables.pop('params')
  grads = jax.jit(jax.grad(mlm_loss, argnums=1), static_argnums=0)(
      model, params, variables, random_tokens(1, 2, 32)
  )
  found = 0
  for path, grad in jax.tree_util.tree_leaves_with_path(grads):
    if path[-1].key in models.PROJECTION_NAMES:
      found += 1
      weight_ndim = 3 if projection == 'conv' else 2
      per_weight = grad.reshape((-1,) + grad.shape[-weight_ndim:])
      assert all(float(jnp.abs(g).max()) > 0 for g in per_weight), path
  assert found > 0


def test_random_projection_is_saved_but_never_trained():
  config = small_config(projection='random', sharing='headwise')
  model = models.MaskedLanguageModel(config)
  variables = init_variables(model)
  params = variables.pop('params')
  assert models.count_projection_matrices(params, config) == 0
  assert models.count_projection_matrices(variables, config) == 4
  constants_before = jax.tree_util.tree_map(np.array, variables)
  optimizer = optax.adamw(1e-2, weight_decay=0.1)
  opt_state = optimizer.init(params)
  tokens = random_tokens(2, 2, 32)
  grad_fn = jax.jit(jax.grad(mlm_loss, argnums=1), static_argnums=0)
  for _ in range(3):
    grads = grad_fn(model, params, variables, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  jax.tree_util.tree_map(np.testing.assert_array_equal, variables, constants_before)
  # The fixed projection is used: another draw changes the output.
  redrawn = init_variables(model, seed=7)
  redrawn.pop('params')
  out = model.apply({'params': params, **variables}, tokens)
  out_redrawn = model.apply({'params': params, **redrawn}, tokens)
  assert float(jnp.abs(out - out_redrawn).max()) > 1e-3


@pytest.mark.parametrize(
    'attention,projection,pre_layer_norm',
    [
        ('full', 'linear', False),
        ('linformer', 'linear', False),
        ('linformer', 'mean', False),
        ('linformer', 'max', False),
        ('linformer', 'conv', False),
        ('linformer', 'random', False),
        ('full', 'linear', True),
        ('linformer', 'linear', True),
    ],
)
def test_model_output_is_padding_invariant(attention, projection, pre_layer_norm):
  config = small_config(
      attention=attention, projection=projection, pre_layer_norm=pre_layer_norm, sharing='none'
  )
  model = models.MaskedLanguageModel(config)
  variables = init_variables(model)
  apply = jax.jit(model.apply)
  real_len = 11
  tokens = random_tokens(3, 3, 32)
  alone = apply(variables, tokens[:1, :real_len])[0]
  for padded_len in (real_len, 27, 32):
    mask = jnp.arange(padded_len)[None] < jnp.array([[real_len], [padded_len], [padded_len]])
    batch_tokens = jnp.where(mask, tokens[:, :padded_len], 5)
    batched = apply(variables, batch_tokens, mask)[0, :real_len]
    np.testing.assert_allclose(batched, alone, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('model_class', ['mlm', 'classifier'])
def test_jitted_model_compiles_once(model_class):
  config = small_config()
  model = (
      models.MaskedLanguageModel(config)
      if model_class == 'mlm'
      else models.SequenceClassifier(config, num_classes=3)
  )
  variables = init_variables(model)
  traces = []

  @jax.jit
  def forward(variables, tokens, mask, dropout_key):
    traces.append(1)
    return model.apply(variables, tokens, mask, deterministic=False, rngs={'dropout': dropout_key})

  for step in range(4):
    tokens = random_tokens(step, 2, 32)
    out = forward(variables, tokens, tokens > 3, jax.random.PRNGKey(step))
  assert len(traces) == 1
  assert out.shape == ((2, 32, 40) if model_class == 'mlm' else (2, 3))


def test_bfloat16_compute_keeps_float32_parameters():
  config = small_config(dtype='bfloat16')
  model = models.MaskedLanguageModel(config)
  variables = init_variables(model)
  assert {x.dtype for x in jax.tree_util.tree_leaves(variables)} == {jnp.dtype('float32')}
  tokens = random_tokens(4, 2, 32)
  logits = jax.jit(model.apply)(variables, tokens)
  reference = jax.jit(models.MaskedLanguageModel(small_config()).apply)(variables, tokens)
  assert logits.dtype == jnp.float32
  assert float(jnp.abs(logits - reference).max()) < 0.1


def test_every_parameter_has_logical_axis_names():
  config = small_config(sharing='none', projection='conv')
  boxed = models.SequenceClassifier(config, num_classes=2).init(
      jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32)
  )
  leaves = jax.tree_util.tree_leaves(
      boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )
  assert leaves
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned)
    assert len(leaf.names) == leaf.value.ndim
    assert len(set(leaf.names)) == len(leaf.names)


@pytest.mark.parametrize(
    'overrides,field',
    [
        (dict(projected_len=64), 'projected_len'),
        (dict(projection='conv', projected_len=5), 'projected_len'),
        (dict(projection='mean', projected_len=12), 'projected_len'),
        (dict(sharing='everything'), 'sharing'),
        (dict(projection='fourier'), 'projection'),
        (dict(sharing='layerwise', projected_len=(8, 4)), 'projected_len'),
        (dict(sharing='kv', projected_len=(8, 4)), 'projected_len'),
        (dict(projected_len=(8, 4, 4)), 'projected_len'),
        (dict(attention='sparse'), 'attention'),
        (dict(hidden_dim=18), 'hidden_dim'),
        (dict(dtype='float16'), 'dtype'),
    ],
)
def test_bad_model_config_is_a_clear_error(overrides, field):
  with pytest.raises(ValueError, match=f'config.model.{field}=') as error:
    small_config(**overrides)
  assert 'allowed' in str(error.value)


def test_unknown_config_field_is_an_error():
  fields = ml_collections.ConfigDict({**SMALL, 'num_layer': 3})
  with pytest.raises(ValueError, match='num_layer'):
    ModelConfig.from_config(fields)


def test_from_config_reads_a_config_dict():
  config = ModelConfig.from_config(
      ml_collections.ConfigDict({**SMALL, 'projected_len': [8, 4], 'sharing': 'none'})
  )
  assert config.projected_len == (8, 4) and config.projected_len_for_layer(1) == 4


def test_sequence_longer_than_max_len_is_an_error():
  model = models.MaskedLanguageModel(small_config())
  variables = init_variables(model)
  with pytest.raises(ValueError, match='max_len=32'):
    model.apply(variables, jnp.ones((1, 33), jnp.int32))


def test_logits_at_positions_equal_the_full_logits_there():
  model = models.MaskedLanguageModel(small_config())
  variables = init_variables(model)
  tokens = random_tokens(3, 2, SMALL['max_len'])
  positions = jnp.array([[0, 5, 5, 31], [7, 2, 30, 1]])
  full = model.apply(variables, tokens)
  gathered = model.apply(variables, tokens, positions=positions)
  assert gathered.shape == (2, 4, SMALL['vocab_size'])
  np.testing.assert_allclose(
      gathered, jnp.take_along_axis(full, positions[:, :, None], axis=1), rtol=1e-6, atol=1e-6
  )


@pytest.mark.parametrize(
    'sharing, projection',
    [('layerwise', 'linear'), ('kv', 'random'), ('headwise', 'linear'), ('headwise', 'mean')],
)
def test_compressing_the_layer_input_first_equals_projecting_every_position_first(
    sharing, projection
):
  """E^T (m (X W + b)) = (E^T m X) W + (E^T m) b: the same attention output
  (random weights and biases, padding), fewer FLOPs."""
  config = ModelConfig(
      vocab_size=11,
      max_len=64,
      num_layers=1,
      num_heads=2,
      hidden_dim=16,
      mlp_dim=32,
      projected_len=8,
      sharing=sharing,
      projection=projection,
      dropout_rate=0.0,
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 60, 16))
  mask = jnp.arange(60)[None] < jnp.array([[60], [37]])
  shared = (None, None)
  if sharing == 'layerwise':
    e = jax.random.normal(jax.random.PRNGKey(1), (64, 8)) / 8**0.5
    shared = (e, e)
  first = layers.SelfAttention(config, 0)
  reference = layers.SelfAttention(config, 0, compress_first=False)
  variables = first.init(jax.random.PRNGKey(2), x, mask, shared, True)
  leaves, tree = jax.tree_util.tree_flatten(nn.meta.unbox(variables))
  keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
  variables = jax.tree_util.tree_unflatten(
      tree, [jax.random.normal(k, leaf.shape) * 0.3 for k, leaf in zip(keys, leaves)]
  )
  run = lambda module: jax.jit(lambda v: module.apply(v, x, mask, shared, True))
  np.testing.assert_allclose(run(first)(variables), run(reference)(variables), rtol=1e-5, atol=1e-5)
  flops = [
      run(module).lower(variables).compile().cost_analysis()['flops']
      for module in (first, reference)
  ]
  assert flops[0] < 0.8 * flops[1], flops
