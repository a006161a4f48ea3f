"""The spectrum of P: hand cases, a float64 reference, the model's keys, a kind's
own P, the CLI.

The `slow` tests run `python -m linformer_jax.spectrum` on a checkpointed run.
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from linformer_jax import spectrum
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention_capture
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.registry import add_declared_settings
from linformer_jax.training import run_builder
from linformer_jax.training import training_run


def naive_attention_matrix(q, k, key_mask, query_mask):
  """softmax(Q K^T / sqrt(d)) one row at a time, in float64."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  batch, q_len, heads, head_dim = q.shape
  p = np.zeros((batch, heads, q_len, k.shape[1]))
  for b in range(batch):
    for h in range(heads):
      for i in range(q_len):
        if not query_mask[b, i]:
          continue
        logits = np.array([q[b, i, h] @ k[b, j, h] for j in range(k.shape[1])]) / np.sqrt(head_dim)
        exp = np.where(key_mask[b], np.exp(logits - logits[key_mask[b]].max()), 0.0)
        p[b, h, i] = exp / exp.sum()
  return p


def test_identity_gives_a_straight_line():
  curve = spectrum.normalised_cumulative_singular_values(np.eye(6))
  np.testing.assert_allclose(curve, np.arange(1, 7) / 6, rtol=1e-12)


def test_a_rank_one_matrix_reaches_one_at_the_first_index():
  rng = np.random.default_rng(0)
  p = np.outer(rng.random(7), rng.random(5))
  curve = spectrum.normalised_cumulative_singular_values(p)
  assert curve.shape == (5,)
  np.testing.assert_allclose(curve, np.ones(5), rtol=1e-12)


def test_a_rotated_and_permuted_diagonal_gives_its_hand_computed_shares():
  # Singular values 3 and 1 (rotations and permutations keep them): 3/4, then 1.
  c, s = np.cos(0.3), np.sin(0.3)
  p = np.array([[c, -s], [s, c]]) @ np.diag([1.0, 3.0]) @ np.array([[0, 1], [1, 0]])
  np.testing.assert_allclose(
      spectrum.normalised_cumulative_singular_values(p), [0.75, 1.0], rtol=1e-12
  )
  # Orthogonal columns of norms 1, 4 and 3: singular values 4, 3, 1 (sum 8).
  q = np.array([[1.0, 0, 0], [0, 0, 3], [0, 4, 0], [0, 0, 0]])
  np.testing.assert_allclose(
      spectrum.normalised_cumulative_singular_values(q), [4 / 8, 7 / 8, 1.0], rtol=1e-12
  )


def test_curves_are_monotone_in_the_unit_interval_and_end_at_one():
  rng = np.random.default_rng(1)
  curves = spectrum.normalised_cumulative_singular_values(rng.normal(size=(3, 2, 9, 4)))
  assert curves.shape == (3, 2, 4)
  assert np.all(np.diff(curves, axis=-1) >= 0)
  assert np.all((curves >= 0) & (curves <= 1))
  np.testing.assert_array_equal(curves[..., -1], 1.0)
  with pytest.raises(ValueError, match='all zeros'):
    spectrum.normalised_cumulative_singular_values(np.zeros((3, 3)))


def test_value_at_index_is_one_based_and_clamped_to_the_rank_bound():
  curve = np.array([0.5, 0.8, 1.0])
  assert spectrum.value_at_index(curve, 2) == (0.8, 2)
  assert spectrum.value_at_index(curve, 128) == (1.0, 3)


def test_attention_matrix_matches_a_naive_float64_softmax():
  rng = np.random.default_rng(2)
  q = rng.normal(size=(2, 5, 3, 4)).astype(np.float32)
  k = rng.normal(size=(2, 6, 3, 4)).astype(np.float32) * 3
  key_mask = np.array([[True] * 6, [True] * 4 + [False] * 2])
  query_mask = np.array([[True] * 5, [True] * 3 + [False] * 2])
  p = attention_capture.attention_matrix(q, k, key_mask, query_mask)
  assert p.dtype == np.float64 and p.shape == (2, 3, 5, 6)
  np.testing.assert_allclose(
      p, naive_attention_matrix(q, k, key_mask, query_mask), rtol=1e-12, atol=1e-15
  )
  np.testing.assert_allclose(p.sum(-1)[0], 1.0, rtol=1e-12)
  np.testing.assert_allclose(p.sum(-1)[1, :, :3], 1.0, rtol=1e-12)
  np.testing.assert_array_equal(p[1, :, :, 4:], 0.0)  # padded keys
  np.testing.assert_array_equal(p[1, :, 3:, :], 0.0)  # padded queries


def test_padding_only_adds_zero_singular_values():
  rng = np.random.default_rng(3)
  q, k = rng.normal(size=(2, 1, 8, 2, 4))
  real = 5
  mask = np.arange(8)[None] < real
  padded = spectrum.normalised_cumulative_singular_values(
      attention_capture.attention_matrix(q, k, mask, mask)
  )
  alone = spectrum.normalised_cumulative_singular_values(
      attention_capture.attention_matrix(q[:, :real], k[:, :real])
  )
  np.testing.assert_allclose(padded[..., :real], alone, atol=1e-12)
  np.testing.assert_allclose(padded[..., real:], 1.0, atol=1e-12)


SMALL = dict(
    vocab_size=40,
    max_len=16,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    mlp_dim=32,
    projected_len=4,
    dropout_rate=0.0,
)


@pytest.mark.parametrize(
    'sharing,projection', [('layerwise', 'linear'), ('none', 'random'), ('kv', 'mean')]
)
def test_keys_are_the_ones_the_model_attends_over(sharing, projection):
  config = ModelConfig(**SMALL, sharing=sharing, projection=projection)
  model = models.MaskedLanguageModel(config)
  variables = nn.meta.unbox(
      jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, 16), jnp.int32))
  )
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 16), 0, 40)
  padding_mask = np.arange(16)[None] < np.array([[16], [11], [0]])
  # Each layer's input too (post-LN: the embedding's or the previous layer's
  # last norm), since a layer that compresses its input first never projects
  # every position to a key.
  capture = lambda module, method: attention_capture.capture_intermediates(module, method) or (
      module.name in ('embedding_norm', 'mlp_norm')
  )
  _, captured = jax.jit(
      lambda v: model.apply(
          v, tokens, padding_mask, capture_intermediates=capture, mutable=['intermediates']
      )
  )(variables)
  layers = attention_capture.context_queries_and_keys(
      captured['intermediates'], config, padding_mask
  )
  encoder = captured['intermediates']['encoder']
  for layer, (q, keys, key_mask) in enumerate(layers):
    dense = encoder[f'layers_{layer}']['attention']
    assert q is dense['query']['__call__'][0]
    inputs = (
        encoder['embedding_norm'] if layer == 0 else encoder[f'layers_{layer - 1}']['mlp_norm']
    )['__call__'][0]
    key_params = variables['params']['encoder'][f'layers_{layer}']['attention']['key']
    k = np.einsum(
        'bnd,dhe->bnhe',
        np.asarray(inputs, np.float64),
        np.asarray(key_params['kernel'], np.float64),
    ) + np.asarray(key_params['bias'], np.float64)
    if projection == 'mean':
      windows = (k * padding_mask[..., None, None]).reshape(3, 4, 4, 2, 8)
      counts = padding_mask.reshape(3, 4, 4).sum(-1)
      expected = windows.sum(2) / np.maximum(counts, 1)[..., None, None]
      np.testing.assert_array_equal(key_mask, counts > 0)
    else:
      collection = 'params' if projection == 'linear' else 'constants'
      owner = variables[collection]['encoder']
      e = (
          owner['shared_projection']['kv_projection']
          if sharing == 'layerwise'
          else owner[f'layers_{layer}']['attention']['projection']['key_projection']
      )
      equation = 'nk,bnhd->bkhd' if e.ndim == 2 else 'hnk,bnhd->bkhd'
      expected = np.einsum(equation, np.asarray(e, np.float64), k * padding_mask[..., None, None])
      assert key_mask is None
    np.testing.assert_allclose(keys, expected, rtol=1e-5, atol=1e-6)
  batch = {'inputs': np.asarray(tokens), 'padding_mask': padding_mask}
  attended = attention_capture.attended_by_layer(captured['intermediates'], config)
  curves, count = spectrum.mean_curves(
      lambda *args, **kwargs: attended, variables, config, [batch], num_sequences=64
  )
  assert count == 2  # the all-padding row is skipped
  assert [c.shape for c in curves] == [(2, 4)] * 2


def spectrum_flags(workdir, out):
  """The command-line flags of the spectrum of a configs/tiny.py run."""
  return ['--config', 'configs/tiny.py', '--workdir', str(workdir), '--out', str(out)]


def checkpointed(workdir, config):
  """A run of `config`'s checkpoint as the trainer writes it, at its initial step.

  The spectrum reads any checkpoint the same way; skipping the training steps
  (whose compilation takes half a minute on 2 cores) keeps the test short.
  """
  run = training_run.TrainingRun(run_builder.build_parts(config), str(workdir))
  run.save()
  run.store.close()
  return config


def checkpointed_run(workdir, attention):
  """A tiny run of `attention`'s checkpoint at its initial step."""
  config = tiny.get_config()
  config.model.attention = attention
  return checkpointed(workdir, config)


def check_curves(report, width):
  assert len(report['layers']) == report['num_layers'] == 2
  for layer in report['layers']:
    assert len(layer['heads']) == report['num_heads'] == 2
    for curve in [layer['mean_curve']] + [head['curve'] for head in layer['heads']]:
      curve = np.array(curve)
      assert curve.shape == (width,)
      assert np.all((curve >= 0) & (curve <= 1))
      assert np.all(np.diff(curve) >= 0)
      assert curve[-1] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow
def test_the_command_on_a_full_attention_run(tmp_path, run_command):
  checkpointed_run(tmp_path / 'run', 'full')
  out = tmp_path / 'out'
  result = run_command(
      'spectrum',
      *spectrum_flags(tmp_path / 'run', out),
      '--config.model.attention=full',
      '--num_sequences=6',
      '--index=8',
  )
  assert result.returncode == 0, result.stderr
  with open(out / 'spectrum.json') as f:
    report = json.load(f)
  assert (report['attention'], report['n'], report['k']) == ('full', 32, None)
  assert report['num_sequences'] == 6 and report['step'] == 0
  check_curves(report, width=32)
  assert all(layer['index'] == 8 for layer in report['layers'])
  head = report['layers'][1]['heads'][0]
  assert head['value_at_index'] == head['curve'][7]
  assert (out / 'cumulative_singular_values.png').stat().st_size > 0
  assert (out / 'heatmap.png').stat().st_size > 0
  assert 'layer 1: cumulative singular value at index 8 of 32' in result.stdout


def test_a_linformer_run_has_k_wide_curves_and_a_clamped_index(tmp_path):
  config = checkpointed_run(tmp_path / 'run', 'linformer')
  report = spectrum.compute_spectrum(config, str(tmp_path / 'run'), index=128)
  assert (report['attention'], report['n'], report['k']) == ('linformer', 32, 8)
  assert report['num_sequences'] == 8  # all the tiny config's evaluation rows
  check_curves(report, width=8)
  assert [layer['index'] for layer in report['layers']] == [8, 8]
  assert any('clamped to 8' in note for note in report['notes'])
  paths = spectrum.write_outputs(report, str(tmp_path / 'out'))
  assert all(os.path.getsize(path) > 0 for path in paths)


@pytest.mark.slow
def test_a_workdir_without_a_checkpoint_is_a_one_line_error(tmp_path, run_command):
  result = run_command('spectrum', *spectrum_flags(tmp_path, tmp_path / 'out'))
  assert result.returncode == 2
  assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1
  assert 'holds no checkpoint' in result.stderr
  assert not (tmp_path / 'out').exists()


def test_a_kind_that_overrides_attend_alone_is_refused_before_loading(tmp_path):
  """Its P is not softmax(Q K^T / sqrt(d)) and it does not say what it is: a
  spectrum of the default's would describe attention the model never used."""
  extension = 'docs/examples/scaled_linformer.py'
  import_extensions((extension,))
  config = tiny.get_config()
  config.extensions = (extension,)
  config.model.attention = 'scaled_linformer'
  add_declared_settings(config)
  with pytest.raises(ConfigError, match="attention='scaled_linformer' weighs its keys its own way"):
    spectrum.compute_spectrum(config, str(tmp_path / 'nothing_here'))


def test_a_kind_with_its_own_weights_has_the_spectrum_of_its_p(tmp_path):
  """The tempered example's P (`attention_weights`): the Linformer's of the
  tempered queries, k wide."""
  extension = 'docs/examples/tempered_attention.py'
  import_extensions((extension,))
  reports = {}
  for attention, temperature in (('linformer', 1.0), ('tempered_linformer', 4.0)):
    config = tiny.get_config()
    config.extensions = (extension,)
    config.model.attention = attention
    add_declared_settings(config)
    if attention == 'tempered_linformer':
      config.model.temperature_init = temperature
    checkpointed(tmp_path / attention, config)
    reports[attention] = spectrum.compute_spectrum(config, str(tmp_path / attention), index=2)
  tempered = reports['tempered_linformer']
  assert (tempered['attention'], tempered['k']) == ('tempered_linformer', 8)
  check_curves(tempered, width=8)
  assert spectrum.title(tempered).startswith('attention=tempered_linformer (k=8), n=32')
  # A temperature above 1 flattens every row towards the uniform one, P towards
  # rank one: more of the total in the first two singular values.
  for plain, hot in zip(reports['linformer']['layers'], tempered['layers']):
    assert hot['mean_value_at_index'] > plain['mean_value_at_index']
