"""The examples of docs/examples/ register a projection and an attention kind
from files outside the package, and a config, a sweep and a training run use them."""

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import finetune_sst2
from configs import from_workdir
from linformer_jax import sweep as sweep_lib
from linformer_jax import testing
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention
from linformer_jax.model import attention_kinds
from linformer_jax.model import layers
from linformer_jax.model import logical_axes
from linformer_jax.model import models
from linformer_jax.model import projections
from linformer_jax.model.projections import linear
from linformer_jax.training import trainer
from tests.run_helpers import losses_by_step
from tests.run_helpers import small_model_config
from tests.run_helpers import tiny_config

STRIDED = 'docs/examples/strided_projection.py'
SCALED = 'docs/examples/scaled_linformer.py'
CONVEX = 'docs/examples/convex_projection.py'


@pytest.fixture(scope='module', autouse=True)
def examples():
  import_extensions([STRIDED, SCALED, CONVEX])


def outputs(config, variables=None):
  """Logits of a masked-LM for a padded batch, and the variables used."""
  model = models.MaskedLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 40)
  mask = jnp.arange(16)[None] < jnp.array([[16], [11]])
  if variables is None:
    # Random weights of a trained model's size, not init's near-uniform attention.
    leaves, tree = jax.tree_util.tree_flatten(
        nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, mask))
    )
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    leaves = [jax.random.normal(key, leaf.shape) * 0.3 for key, leaf in zip(keys, leaves)]
    variables = jax.tree_util.tree_unflatten(tree, leaves)
  return model.apply(variables, tokens, mask), variables


LAYER = "['encoder']['layers_{}']['attention']['projection']"
# The sequence-projection weights checkpoints hold: key paths and shapes.
PINNED_PROJECTION_WEIGHTS = {
    ('linear', 'layerwise', False): {
        "['params']['encoder']['shared_projection']['kv_projection']": (16, 4)
    },
    ('conv', 'none', False): {
        f"['params']{LAYER.format(layer)}['{weight}']": (2, 4, 4, 4)
        for layer in (0, 1)
        for weight in ('key_projection', 'value_projection')
    },
    ('random', 'kv', False): {
        f"['constants']{LAYER.format(layer)}['kv_projection']": (16, 4) for layer in (0, 1)
    },
    ('linear', 'headwise', True): {
        f"['params']{LAYER.format(layer)}['{weight}']": (16, 4)
        for layer in (0, 1)
        for weight in ('key_projection', 'value_projection')
    },
}


@pytest.mark.parametrize('projection,sharing,causal', list(PINNED_PROJECTION_WEIGHTS))
def test_projection_weights_keep_their_checkpoint_names_and_shapes(projection, sharing, causal):
  config = small_model_config(projection=projection, sharing=sharing, causal=causal, block_len=8)
  model = (models.CausalLanguageModel if causal else models.MaskedLanguageModel)(config)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.ones((2, 16), jnp.int32))
  weights = {
      jax.tree_util.keystr(path): leaf.shape
      for path, leaf in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(shapes))
      if 'projection' in jax.tree_util.keystr(path)
  }
  assert weights == PINNED_PROJECTION_WEIGHTS[(projection, sharing, causal)]


def made_the_old_way(module, name, *, config, projected_len, per_head):
  """A projection weight as the kinds made it before they declared it: each
  kind's former `make_weight`, calling `module.param` or `module.variable`."""
  heads = (config.num_heads,) if per_head else ()
  head_axes = (logical_axes.PROJECTION_HEADS,) if per_head else ()
  shape = heads + (config.max_len, projected_len)
  names = head_axes + (logical_axes.LENGTH, logical_axes.PROJECTED_LENGTH)
  matrix_init = nn.with_logical_partitioning(
      linear.matrix_initializer(config, projected_len, per_head), names
  )
  if config.projection == 'linear':
    return module.param(name, matrix_init, shape, jnp.float32)
  if config.projection == 'random':
    return module.variable(
        'constants', name, lambda: matrix_init(module.make_rng('params'), shape, jnp.float32)
    ).value
  if config.projection == 'conv':
    window = config.compressed_span // projected_len
    names = head_axes + (logical_axes.CONV_WINDOW, logical_axes.HEAD_DIM_IN, logical_axes.HEAD_DIM)
    fan_in = nn.initializers.variance_scaling(
        1.0, 'fan_in', 'normal', in_axis=(-3, -2), out_axis=-1
    )
    shape = heads + (window, config.head_dim, config.head_dim)
    return module.param(name, nn.with_logical_partitioning(fan_in, names), shape, jnp.float32)
  assert config.projection == 'convex', config.projection
  init = nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), names)
  return module.param(name, init, shape, jnp.float32)


def initial_variables(config):
  """Every variable of a freshly initialised model, path -> (logical axes, array)."""
  model = (models.CausalLanguageModel if config.causal else models.MaskedLanguageModel)(config)
  variables = model.init(jax.random.PRNGKey(3), jnp.ones((2, 16), jnp.int32))
  leaves = jax.tree_util.tree_leaves_with_path(
      variables, is_leaf=lambda leaf: isinstance(leaf, nn.Partitioned)
  )
  return {
      jax.tree_util.keystr(path): (getattr(leaf, 'names', None), np.asarray(nn.meta.unbox(leaf)))
      for path, leaf in leaves
  }


@pytest.mark.parametrize(
    'fields',
    [
        dict(projection='linear', sharing='none'),
        dict(projection='conv', sharing='headwise'),
        dict(projection='random', sharing='kv', scan_layers=True),
        dict(projection='convex', sharing='layerwise'),
    ],
    ids=lambda fields: '-'.join(str(value) for value in fields.values()),
)
def test_declared_projection_weights_are_the_weights_the_kinds_made_themselves(fields, monkeypatch):
  """Same names, collections, logical axes and bitwise values for the same
  seed: checkpoints of runs from before the kinds declared their weights load
  unchanged, and a seed starts where it did."""
  config = small_model_config(**fields)
  declared = initial_variables(config)
  monkeypatch.setattr(
      layers.SequenceProjection,
      '_weight',
      lambda self, name: made_the_old_way(
          self, name, config=self.config, projected_len=self.projected_len, per_head=self.per_head
      ),
  )
  made = initial_variables(config)
  assert declared.keys() == made.keys()
  assert any('projection' in path for path in made)
  for path, (names, value) in made.items():
    assert declared[path][0] == names, path
    np.testing.assert_array_equal(declared[path][1], value, err_msg=path)
    assert declared[path][1].dtype == value.dtype, path


@projections.REGISTRY.register('transposed_for_tests')
class TransposedMatrix(projections.SequenceProjectionKind):
  """E made [k, max_len], not the [max_len, k] the layout asks for."""

  def weight(self, *, config, projected_len, per_head):
    heads = (config.num_heads,) if per_head else ()
    head_axes = (logical_axes.PROJECTION_HEADS,) if per_head else ()
    return projections.Parameter(
        shape=heads + (projected_len, config.max_len),
        init=jax.nn.initializers.normal(1.0),
        axes=head_axes + (logical_axes.PROJECTED_LENGTH, logical_axes.LENGTH),
    )

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    rows = jnp.swapaxes(weight, -1, -2)
    return attention.project_sequence(x, rows, key_padding_mask=key_padding_mask, name=name), None


@pytest.mark.parametrize(
    'sharing,weight,given,expected',
    [
        ('kv', 'kv_projection', (4, 16), '[max_len, k] = (16, 4)'),
        ('none', 'key_projection', (2, 4, 16), '[heads, max_len, k] = (2, 16, 4)'),
    ],
)
def test_a_weight_in_another_layout_than_e_is_refused_in_one_line(sharing, weight, given, expected):
  model = models.MaskedLanguageModel(
      small_model_config(projection='transposed_for_tests', sharing=sharing)
  )
  with pytest.raises(ConfigError) as error:
    jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32))
  message = str(error.value)
  assert message.startswith(
      f"projection='transposed_for_tests': weight() declared {weight} with the shape {given}, "
      f'not {expected}; '
  )
  assert 'weight_shape' in message and '\n' not in message


def test_a_kind_that_declares_its_own_weight_shape_is_checked_against_it():
  conv = projections.kind('conv')
  config = small_model_config(projection='conv')
  assert conv.weight_shape(config=config, projected_len=4, per_head=True) == (2, 4, 4, 4)
  declared = conv.weight(config=config, projected_len=4, per_head=False)
  assert (
      conv.check_weight(declared, 'kv_projection', config=config, projected_len=4, per_head=False)
      == declared
  )
  with pytest.raises(ConfigError, match=r'shape \(4, 4\), not \(4, 4, 4\) \(its weight_shape\)'):
    conv.check_weight(
        declared._replace(shape=(4, 4)),
        'kv_projection',
        config=config,
        projected_len=4,
        per_head=False,
    )


@projections.REGISTRY.register('old_style_for_tests')
class OldStyleMatrix(projections.SequenceProjectionKind):
  """A kind written for the versions that handed `make_weight` the Flax module."""

  def make_weight(self, module, name, *, config, projected_len, per_head):
    shape = (config.max_len, projected_len)
    return module.param(name, nn.initializers.normal(1.0), shape, jnp.float32)

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    return attention.project_sequence(x, weight, key_padding_mask=key_padding_mask, name=name), None


def test_a_kind_that_still_makes_its_weight_is_refused_in_one_line():
  with pytest.raises(ConfigError) as error:
    small_model_config(projection='old_style_for_tests')
  message = str(error.value)
  assert message.startswith(
      "projection='old_style_for_tests': OldStyleMatrix defines make_weight, which is no "
      'longer called; declare its weight with weight(self, *, config, projected_len, per_head)'
  )
  assert 'docs/extending.md' in message and '\n' not in message


@pytest.mark.parametrize(
    'option', [dict(learning_rate_scale=0.1), dict(weight_decay=False)], ids=str
)
def test_a_projection_weight_with_its_own_optimizer_settings_is_refused(option):
  config = small_model_config(projection='linear')
  kind = projections.kind('linear')
  declared = kind.weight(config=config, projected_len=4, per_head=False)._replace(**option)
  with pytest.raises(ConfigError) as error:
    kind.check_weight(declared, 'kv_projection', config=config, projected_len=4, per_head=False)
  message = str(error.value)
  assert message.startswith("projection='linear': weight() declared kv_projection with ")
  assert 'config.model.projection_learning_rate_scale' in message and '\n' not in message


def test_the_examples_register_their_names():
  assert 'strided' in projections.REGISTRY
  assert 'scaled_linformer' in attention_kinds.REGISTRY


@pytest.mark.parametrize(
    'field,registered', [('projection', 'strided'), ('attention', 'scaled_linformer')]
)
def test_an_unknown_name_is_an_error_listing_the_registered_ones(field, registered):
  with pytest.raises(ConfigError, match=f'config.model.{field}=') as error:
    small_model_config(**{field: 'fourier'})
  message = str(error.value)
  assert registered in message and 'config.extensions' in message
  built_in = projections.BUILT_IN if field == 'projection' else attention_kinds.BUILT_IN
  assert all(repr(name) in message for name in built_in)


def naive_strided_sample(x, mask, window):
  """Position w * window of x (zero beyond its length), and whether it is real."""
  batch, length = mask.shape
  kept = [w * window for w in range(12 // window)]
  rows = np.stack([x[:, p] if p < length else np.zeros_like(x[:, 0]) for p in kept], axis=1)
  real = np.array([[p < length and bool(mask[b, p]) for p in kept] for b in range(batch)])
  return rows, real


def test_strided_sampling_keeps_the_first_position_of_each_window():
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 10, 2, 3))
  mask = jnp.arange(10)[None] < jnp.array([[10], [5]])
  kind = projections.kind('strided')

  def compress(x, mask):
    return kind.compress(x, None, max_len=12, projected_len=3, key_padding_mask=mask)

  testing.check_against_reference(
      compress, lambda x, mask: naive_strided_sample(x, mask, 4), x, mask
  )
  np.testing.assert_array_equal(compress(x, mask)[1], [[True, True, True], [True, True, False]])


@pytest.mark.parametrize(
    'fields',
    [
        dict(projection='strided'),
        dict(projection='strided', causal=True),
        dict(attention='scaled_linformer', sharing='none'),
    ],
)
def test_the_examples_pass_the_checks_an_author_runs(fields):
  config = testing.small_config(num_layers=1, **fields)
  if config.causal:
    testing.check_no_causal_leakage(config)
  testing.check_padding_invariance(config)


@pytest.mark.long
def test_the_strided_projection_changes_the_model_and_serves_causal_models():
  strided, variables = outputs(small_model_config(projection='strided'))
  # 'mean' holds no weights either: the same variables, another compression.
  pooled, _ = outputs(small_model_config(projection='mean'), variables)
  assert np.all(np.isfinite(strided))
  assert not np.allclose(strided, pooled, atol=1e-4)
  causal_config = small_model_config(projection='strided', causal=True, block_len=8, num_layers=1)
  causal = models.CausalLanguageModel(causal_config)
  tokens = jnp.ones((1, 16), jnp.int32)
  logits = causal.apply(causal.init(jax.random.PRNGKey(0), tokens), tokens)
  assert np.all(np.isfinite(logits))


def test_sampling_the_layer_input_first_gives_what_sampling_the_keys_gives():
  config = small_model_config(projection='strided', sharing='kv')
  x = jax.random.normal(jax.random.PRNGKey(4), (2, 16, 8))
  mask = jnp.arange(16)[None] < jnp.array([[16], [11]])
  first = layers.SelfAttention(config, 0)
  reference = layers.SelfAttention(config, 0, compress_first=False)
  variables = first.init(jax.random.PRNGKey(5), x, mask, (None, None), True)
  # Non-zero biases: the compressed rows must take theirs exactly once.
  variables = jax.tree_util.tree_map(lambda leaf: leaf + 0.1, nn.meta.unbox(variables))
  expected = reference.apply(variables, x, mask, (None, None), True)
  np.testing.assert_allclose(
      first.apply(variables, x, mask, (None, None), True), expected, rtol=1e-5, atol=1e-6
  )


def naive_scaled_attention(q, keys, values):
  """softmax(log(k) q keys^T / sqrt(d)) values, in float64, head by head."""
  q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
  logits = np.einsum('bqhd,bkhd->bhqk', q, keys) * math.log(keys.shape[1]) / math.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', weights, values)


def test_scaled_linformer_matches_a_float64_reference_and_changes_the_model():
  q, keys, values = jax.random.normal(jax.random.PRNGKey(3), (3, 2, 6, 2, 4))
  kind = attention_kinds.kind('scaled_linformer')
  testing.check_against_reference(
      lambda q, keys, values: kind.attend(q, keys, values, None, kernel='einsum'),
      naive_scaled_attention,
      q,
      keys[:, :3],
      values[:, :3],
  )
  scaled, variables = outputs(small_model_config(attention='scaled_linformer'))
  plain, _ = outputs(small_model_config(attention='linformer'), variables)
  assert not np.allclose(scaled, plain, atol=1e-4)
  with pytest.raises(ConfigError, match='config.model.causal=True'):
    small_model_config(attention='scaled_linformer', causal=True)


@pytest.mark.long
@pytest.mark.slow
def test_a_tiny_training_run_with_both_examples(tmp_path):
  """Both parts at once: one run, one compilation."""
  config = tiny_config(
      total_steps=4,
      warmup_steps=1,
      log_every=2,
      eval_every=4,
      checkpoint_every=4,
      extensions=(STRIDED, SCALED),
      **{'model.projection': 'strided', 'model.attention': 'scaled_linformer'},
  )
  config.data.max_eval_batches = 1
  results = trainer.train_and_evaluate(config, str(tmp_path))
  assert results['step'] == 4
  losses = losses_by_step(str(tmp_path))
  assert losses and all(math.isfinite(loss) for loss in losses.values())
  # The run's config.json keeps the files, by absolute path, and a fine-tuning
  # config built on the run (configs/finetune_sst2.py:RUN) imports them too.
  files = tuple(os.path.abspath(path) for path in (STRIDED, SCALED))
  assert from_workdir.get_config(str(tmp_path)).extensions == files
  fine_tuning = from_workdir.encoder_of(finetune_sst2.get_config(), str(tmp_path))
  assert fine_tuning.extensions == files
  assert fine_tuning.model.projection == 'strided'
  assert fine_tuning.model.attention == 'scaled_linformer'


def test_a_sweep_variant_may_name_its_own_extension():
  base = tiny_config()
  variants = [
      sweep_lib.Variant('linear'),
      sweep_lib.Variant('strided', {'extensions': (STRIDED,), 'model.projection': 'strided'}),
  ]
  configs = sweep_lib.variant_configs(sweep_lib.Sweep(base, variants))
  assert configs['strided'].model.projection == 'strided'
