"""model.remat and model.scan_layers change how layers run, not what they compute.

With every remat policy the parameters, loss and gradients are those of the
plain model (float32, 1e-5). Scanned layers, given the plain model's layer
parameters stacked, give its loss and gradients too; E/F shared by all layers
stay one parameter; what cannot be scanned, or read scanned, says so.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from linformer_jax import spectrum
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.model_config import REMAT_POLICIES
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_config


def small_model(remat, attention='linformer', sharing='layerwise', scan_layers=False):
  config = tiny.get_config().model
  config.update(
      remat=remat, attention=attention, sharing=sharing, dropout_rate=0.1, scan_layers=scan_layers
  )
  return models.MaskedLanguageModel(ModelConfig.from_config(config))


def init(model, *args):
  """model.init, compiled: a third of the time of running it op by op here."""
  return jax.jit(model.init)(*args)


def loss_and_grads(model, params, tokens, mask, deterministic=False):
  def loss(params):
    logits = model.apply(
        {'params': params},
        tokens,
        mask,
        deterministic=deterministic,
        rngs={'dropout': jax.random.PRNGKey(3)},
    )
    return jnp.mean(jax.nn.log_softmax(logits)[..., 7])

  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize(
    'attention,sharing',
    [('linformer', 'layerwise'), pytest.param('full', 'none', marks=pytest.mark.long)],
)
def test_every_policy_gives_the_same_parameters_loss_and_gradients(attention, sharing):
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 32), 0, 200)
  mask = jnp.arange(32)[None] < jnp.array([[32], [19]])
  reference = small_model('none', attention, sharing)
  params = init(reference, jax.random.PRNGKey(1), tokens, mask)['params']
  expected = loss_and_grads(reference, params, tokens, mask)
  for policy in REMAT_POLICIES[1:]:
    model = small_model(policy, attention, sharing)
    own = init(model, jax.random.PRNGKey(1), tokens, mask)['params']
    jax.tree_util.tree_map(np.testing.assert_array_equal, own, params)  # same names, same init
    got = loss_and_grads(model, params, tokens, mask)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, expected
    )


def test_an_unknown_policy_lists_the_known_ones():
  with pytest.raises(Exception, match=r"model.remat='some'.*'dots_no_batch'"):
    small_model('some')


def stacked(params, num_layers):
  """The plain model's parameters in the scanned layout."""
  encoder = dict(params['encoder'])
  layers = [encoder.pop(f'layers_{i}') for i in range(num_layers)]
  encoder['layers'] = {'layer': jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)}
  return {**params, 'encoder': encoder}


@pytest.mark.parametrize('sharing,remat', [('layerwise', 'full'), ('none', 'none')])
def test_scanned_layers_compute_what_the_loop_computes(sharing, remat):
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 32), 0, 200)
  mask = jnp.arange(32)[None] < jnp.array([[32], [19]])
  plain = small_model('none', sharing=sharing)
  scanned = small_model(remat, sharing=sharing, scan_layers=True)
  params = nn.meta.unbox(init(plain, jax.random.PRNGKey(1), tokens, mask)['params'])
  own = nn.meta.unbox(init(scanned, jax.random.PRNGKey(1), tokens, mask)['params'])
  converted = stacked(params, 2)
  shapes = lambda tree: jax.tree_util.tree_map(jnp.shape, tree)  # noqa: E731
  assert shapes(own) == shapes(converted)
  # E and F shared by all layers stay one parameter, outside the stack.
  assert ('shared_projection' in own['encoder']) == (sharing == 'layerwise')
  loss, grads = loss_and_grads(scanned, converted, tokens, mask, deterministic=True)
  expected_loss, expected_grads = loss_and_grads(plain, params, tokens, mask, deterministic=True)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      grads,
      stacked(expected_grads, 2),
  )


def test_what_cannot_be_scanned_or_read_scanned_says_what_to_set(tmp_path):
  config = tiny.get_config()
  config.model.scan_layers = True
  per_layer_k = {**config.model.to_dict(), 'projected_len': (8, 16)}
  with pytest.raises(ConfigError, match=r'projected_len=\(8, 16\) must be one k'):
    ModelConfig.from_config(per_layer_k)
  with pytest.raises(ConfigError, match=r'scan_layers=False, not True.*scan_layers=False'):
    saved = {'model': {**config.model.to_dict(), 'scan_layers': False}}
    run_config.check_same_model(saved, run_config.RunConfig.from_config(config), str(tmp_path))
  with pytest.raises(ConfigError, match='spectrum reads layers by name'):
    spectrum.compute_spectrum(config, str(tmp_path))
