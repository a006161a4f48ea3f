"""The pooling probe: logistic regression on frozen features, `<s>` attention.

Runs on the encoder of a tiny pretraining run and a toy sentiment task whose
label is one word, so a probe on the mean of the tokens can read it.
"""

import json
import math

import numpy as np
import pytest

from configs import classification
from configs import tiny
from linformer_jax import pooling_probe
from linformer_jax.errors import ConfigError
from linformer_jax.training import trainer


def test_the_probe_fits_separable_data_and_not_noise():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(400, 6))
  y = (x[:, 2] > 0).astype(np.int32)
  assert pooling_probe.probe_accuracy(x[:300], y[:300], x[300:], y[300:], 2) >= 0.97
  noise = rng.integers(0, 2, 400).astype(np.int32)
  assert (
      abs(pooling_probe.probe_accuracy(x[:300], noise[:300], x[300:], noise[300:], 2) - 0.5) < 0.15
  )


def write_toy_tsv(folder, count):
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True, exist_ok=True)
  for split, size in (('train', count), ('dev', 64)):
    lines = ['sentence\tlabel']
    for _ in range(size):
      label = int(rng.integers(2))
      word = ['dull', 'great'][label]
      lines.append(f'the film was {word} and long\t{label}')
    (folder / f'{split}.tsv').write_text('\n'.join(lines) + '\n')


@pytest.fixture(scope='module')
def pretrained(tiny_run):
  return tiny_run[0]


def probe_config(data_dir, init_from, **overrides):
  config = classification.get_config()
  config.model = tiny.get_config().model
  config.data.tokenizer, config.data.vocab_size = 'byte', 260
  config.data.path = str(data_dir)
  config.data.split_files = {'train': ['train.tsv'], 'validation': ['dev.tsv']}
  config.batch_size = config.eval_batch_size = 16
  config.init_from = init_from
  config.update_from_flattened_dict(overrides)
  return config


@pytest.mark.parametrize('attention', ['linformer', 'full'])
def test_the_report_has_probes_and_attention_per_layer(pretrained, tmp_path, attention):
  write_toy_tsv(tmp_path / 'data', count=256)
  if attention == 'full':
    init_from = str(tmp_path / 'full')
    trainer.train_and_evaluate(_full_config(), init_from)
  else:
    init_from = pretrained
  config = probe_config(tmp_path / 'data', init_from, **{'model.attention': attention})
  report = pooling_probe.probe(config, str(tmp_path / 'probe'), train_batches=8)
  json.dumps(report)
  assert report['train_examples'] == 128 and report['eval_examples'] == 64
  assert [row['layer'] for row in report['layers']] == [1, 2]
  keys = 8 if attention == 'linformer' else report['n']
  for row in report['layers']:
    assert 0.0 <= row['probe_first'] <= 1.0 and 0.0 <= row['probe_mean'] <= 1.0
    assert 0.0 <= row['s_entropy_nats'] <= math.log(keys) + 1e-9
    assert 1.0 <= row['s_effective_keys'] <= keys + 1e-6
    assert 0.0 < row['s_largest_weight'] <= 1.0
    if attention == 'full':
      assert row['s_token_weight_sum'] == pytest.approx(1.0)
      assert row['s_negative_token_weight_share'] == 0.0
      assert row['real_tokens_per_slot'] is None
    else:
      assert math.isfinite(row['s_token_weight_sum'])
      assert 1.0 <= row['real_tokens_per_slot'] <= report['mean_real_tokens'] + 1e-6
  # One word decides the label: the mean of the tokens reads it.
  assert max(row['probe_mean'] for row in report['layers']) >= 0.9


def _full_config():
  config = tiny.get_config()
  config.model.attention = 'full'
  return config


def test_a_config_without_init_from_is_refused(tmp_path):
  config = probe_config(tmp_path, '')
  with pytest.raises(ConfigError, match='config.init_from'):
    pooling_probe.probe(config, str(tmp_path / 'probe'))


def test_token_weights_are_p_for_full_attention_and_p_f_for_linformer():
  rng = np.random.default_rng(1)
  p = rng.dirichlet(np.ones(4), size=(2, 3))  # [batch, heads, k]
  mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
  f = rng.normal(size=(6, 4))
  w = pooling_probe.token_weights(p, f, mask)
  expected = np.einsum('bhk,nk->bhn', p, f) * mask[:, None]
  np.testing.assert_allclose(w, expected)
  assert not np.any(w[0, :, 3:])
  per_head = rng.normal(size=(3, 6, 4))
  np.testing.assert_allclose(
      pooling_probe.token_weights(p, per_head, mask)[1, 2], p[1, 2] @ per_head[2].T
  )
  full = rng.dirichlet(np.ones(6), size=(2, 3))
  np.testing.assert_allclose(pooling_probe.token_weights(full, None, mask), full * mask[:, None])


def test_tokens_per_slot_counts_the_real_positions_a_slot_mixes():
  mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
  copies = np.zeros((6, 3))
  copies[[0, 2, 5], [0, 1, 2]] = 2.0  # each slot copies one position
  averages = np.ones((6, 3))  # each slot averages every position
  np.testing.assert_allclose(pooling_probe.slot_positions(copies, mask), [2 / 3, 1.0])
  np.testing.assert_allclose(pooling_probe.slot_positions(averages, mask), [4.0, 6.0])
  per_head = np.stack([copies, averages])  # [heads, n, k]: the mean over heads
  np.testing.assert_allclose(pooling_probe.slot_positions(per_head, mask), [(2 / 3 + 4) / 2, 3.5])
  noise = np.random.default_rng(0).normal(size=(3000, 200))
  assert pooling_probe.slot_positions(noise, np.ones((1, 3000), bool))[0] == pytest.approx(
      1000, rel=0.05
  )
  assert np.isnan(pooling_probe.slot_positions(None, mask)).all()
