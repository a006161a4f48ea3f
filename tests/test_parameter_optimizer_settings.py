"""An attention kind's own parameters declare their learning-rate scale and
whether weight decay applies (`attention_kinds.Parameter`), and the optimizer
honours both."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import logical_axes
from linformer_jax.model.attention_kinds.full import FullAttention
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import train_steps
from tests.run_helpers import tiny_config


@attention_kinds.REGISTRY.register('optimizer_settings_probe')
class OptimizerSettingsProbe(FullAttention):
  """Full attention over queries q * scale * gain + offset, per head: a frozen
  scale, an offset matrix never decayed and a gain vector always decayed."""

  def parameters(self, config):
    heads = (logical_axes.HEADS,)
    return {
        'query_scale': attention_kinds.Parameter(
            (config.num_heads,), nn.initializers.ones, heads, learning_rate_scale=0.0
        ),
        'query_offset': attention_kinds.Parameter(
            (config.num_heads, config.head_dim),
            nn.initializers.normal(1.0),
            heads + (logical_axes.HEAD_DIM,),
            weight_decay=False,
        ),
        'query_gain': attention_kinds.Parameter(
            (config.num_heads,), nn.initializers.ones, heads, weight_decay=True
        ),
    }

  def attend(self, q, keys, values, key_mask, *, kernel):
    scale = (self.params['query_scale'] * self.params['query_gain'])[:, None]
    q = (q * scale + self.params['query_offset']).astype(q.dtype)
    return super().attend(q, keys, values, key_mask, kernel=kernel)


def probe_config():
  return tiny_config(
      **{
          'model.attention': 'optimizer_settings_probe',
          'model.dropout_rate': 0.0,
          'warmup_steps': 0,  # the full learning rate from the first step
          'weight_decay': 0.1,
      }
  )


def attention_of(params, layer=0):
  return params['encoder'][f'layers_{layer}']['attention']


def test_a_parameters_declared_settings_reach_the_optimizer_settings():
  settings = run_config.RunConfig.from_config(probe_config()).optimizer
  assert settings.attention_parameters == (
      ('query_scale', 0.0, None),
      ('query_offset', 1.0, False),
      ('query_gain', 1.0, True),
  )
  default = attention_kinds.Parameter((2,), nn.initializers.ones, (logical_axes.HEADS,))
  assert (default.learning_rate_scale, default.weight_decay) == (1.0, None)


def test_weight_decay_and_scale_follow_each_parameters_declaration():
  config = probe_config()
  parts = run_builder.build_parts(config)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  tokens = jnp.ones((1, config.model.max_len), jnp.int32)
  params = nn.meta.unbox(jax.jit(parts.model.init)(jax.random.PRNGKey(0), tokens))['params']
  state = optimizer.init(params)
  update = jax.jit(lambda grads: optimizer.update(grads, state, params)[0])
  # A zero gradient: only weight decay moves a parameter.
  decayed = attention_of(update(jax.tree_util.tree_map(jnp.zeros_like, params)))
  np.testing.assert_array_equal(decayed['query_offset'], 0.0)  # a matrix, declared undecayed
  np.testing.assert_array_equal(decayed['query_scale'], 0.0)  # frozen
  np.testing.assert_allclose(  # a vector, declared decayed: -lr * decay * value
      decayed['query_gain'], -config.learning_rate * 0.1 * attention_of(params)['query_gain']
  )
  assert np.all(decayed['query']['kernel'] != 0)  # the rule: matrices decay
  np.testing.assert_array_equal(decayed['query']['bias'], 0.0)  # and vectors do not
  # Any gradient: the frozen parameter's update is zero, the others' are not.
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  noise = [jax.random.normal(key, leaf.shape) for key, leaf in zip(keys, leaves)]
  updates = attention_of(update(tree.unflatten(noise)))
  np.testing.assert_array_equal(updates['query_scale'], 0.0)
  for name in ('query_offset', 'query_gain'):
    assert np.all(updates[name] != 0), name


def test_a_frozen_parameter_keeps_its_value_through_a_train_step_while_the_rest_trains():
  config = probe_config()
  parts = run_builder.build_parts(config)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  length = config.model.max_len
  state = train_steps.init_train_state(
      jax.random.PRNGKey(0), model=parts.model, optimizer=optimizer, seq_len=length
  )
  initial = jax.tree_util.tree_map(np.asarray, state.params)
  step = jax.jit(
      lambda s, b: train_steps.train_step(
          s,
          b,
          jax.random.PRNGKey(1),
          loss_sums=train_steps.masked_lm_loss(parts.model, length),
          optimizer=optimizer,
      )
  )
  keys = jax.random.split(jax.random.PRNGKey(2), 2)
  weights = jax.random.bernoulli(keys[0], 0.3, (4, length)).astype(jnp.float32)
  targets = jax.random.randint(keys[1], (4, length), 0, config.data.vocab_size)
  batch = {
      'inputs': jnp.where(weights > 0, 3, targets),
      'targets': targets,
      'weights': weights,
      'padding_mask': jnp.ones((4, length), bool),
  }
  state, _ = step(state, batch)
  for layer in range(config.model.num_layers):
    before, after = attention_of(initial, layer), attention_of(state.params, layer)
    np.testing.assert_array_equal(after['query_scale'], before['query_scale'])
    for name in ('query_offset', 'query_gain'):
      assert np.all(after[name] != before[name]), (layer, name)
    assert np.any(after['query']['kernel'] != before['query']['kernel'])


@pytest.mark.parametrize(
    'declared, message',
    [
        (('query_scale', -1.0, None), 'learning_rate_scale=-1.0: use a finite number >= 0'),
        (('query_scale', float('inf'), None), 'learning_rate_scale=inf: use a finite number'),
        (('query_gain', 1.0, 'yes'), "weight_decay='yes': use True, False or None"),
    ],
)
def test_a_setting_the_optimizer_cannot_honour_is_one_line_naming_the_parameter(declared, message):
  settings = run_config.RunConfig.from_config(probe_config()).optimizer
  settings = dataclasses.replace(settings, attention_parameters=(declared,))
  with pytest.raises(ConfigError) as error:
    optimization.create_optimizer(settings)
  assert message in str(error.value) and repr(declared[0]) in str(error.value)
  assert '\n' not in str(error.value)


def test_scanned_layers_decay_the_same_parameters_as_unscanned_ones():
  """A scanned model's variables carry a leading layer axis: its biases and
  norm scales are still no matrices, as in the same model unscanned."""
  from linformer_jax.model import models
  from linformer_jax.model.model_config import ModelConfig

  def decayed_in_a_layer(scan_layers, layer_module):
    config = ModelConfig(
        vocab_size=40, max_len=16, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
        projected_len=4, scan_layers=scan_layers,
    )  # fmt: skip
    tokens = jnp.ones((1, 16), jnp.int32)
    params = nn.meta.unbox(models.MaskedLanguageModel(config).init(jax.random.PRNGKey(0), tokens))
    mask = optimization._decay_mask({})(params['params'])
    decayed = {}
    for path, value in jax.tree_util.tree_flatten_with_path(mask)[0]:
      names = [key.key for key in path]
      if layer_module in names:  # the parameter's path within its layer
        decayed['/'.join(names[names.index(layer_module) + 1 :])] = value
    return decayed

  scanned, unscanned = decayed_in_a_layer(True, 'layer'), decayed_in_a_layer(False, 'layers_0')
  assert scanned == unscanned and len(scanned) > 8
  assert scanned['attention/query/kernel'] and scanned['mlp/wi/kernel']
  never = [name for name in scanned if name.endswith(('/bias', '/scale'))]
  assert len(never) >= 8 and not any(scanned[name] for name in never)
