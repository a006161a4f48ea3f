"""The next-token pipeline (`causal_lm`): targets of hand-made rows, evaluation
batches, and datasets built from configs/tiny.py compared with the masked-LM
pipeline's, which packs and shuffles the same rows (its `targets` are the rows).

The masked-LM batches themselves are pinned by test_masked_lm_data.py.
"""

import dataclasses

import numpy as np
import pytest
from run_helpers import typed

from configs import tiny
from linformer_jax.data import causal_lm
from linformer_jax.data import masked_lm
from linformer_jax.data import packed_batches
from linformer_jax.data import packing
from linformer_jax.data import tokenizer as tokenizer_lib

BYTES = tokenizer_lib.ByteTokenizer()
BOS, EOS, PAD = BYTES.bos_id, BYTES.eos_id, BYTES.pad_id
KEYS = ('inputs', 'targets', 'weights', 'padding_mask')


def take(iterator, count):
  return [next(iterator) for _ in range(count)]


def assert_batches_equal(first, second):
  assert len(first) == len(second)
  for a, b in zip(first, second):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def assert_next_token_batch(batch, seq_len):
  """The documented format, checked row by row against the inputs."""
  assert sorted(batch) == sorted(KEYS)
  assert [batch[key].dtype for key in KEYS] == [np.int32, np.int32, np.float32, np.bool_]
  assert all(batch[key].shape[1] == seq_len for key in KEYS)
  inputs, targets, weights = batch['inputs'], batch['targets'], batch['weights']
  np.testing.assert_array_equal(batch['padding_mask'], inputs != PAD)
  np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
  assert (targets[:, -1] == PAD).all()
  assert set(np.unique(weights)) <= {0.0, 1.0}
  real = batch['padding_mask'].sum(axis=1)
  # One prediction per real token but the last (eos); filler rows have none.
  np.testing.assert_array_equal(weights.sum(axis=1), np.maximum(real - 1, 0))
  chosen = weights == 1.0
  assert (inputs[chosen] != PAD).all() and (targets[chosen] != PAD).all()


# The transform.


def test_next_token_targets_of_a_full_row():
  row = np.array([BOS, 5, 6, 7, EOS], np.int32)
  example = causal_lm.NextTokenTargets(PAD).map(row)
  assert tuple(example) == KEYS
  np.testing.assert_array_equal(example['inputs'], row)
  np.testing.assert_array_equal(example['targets'], [5, 6, 7, EOS, PAD])
  np.testing.assert_array_equal(example['weights'], [1, 1, 1, 1, 0])
  np.testing.assert_array_equal(example['padding_mask'], [True] * 5)
  assert example['weights'].dtype == np.float32 and example['targets'].dtype == np.int32


def test_next_token_targets_of_a_padded_row():
  row = np.array([BOS, 5, 6, EOS, PAD, PAD], np.int32)
  example = causal_lm.NextTokenTargets(PAD).map(row)
  np.testing.assert_array_equal(example['inputs'], row)
  np.testing.assert_array_equal(example['targets'], [5, 6, EOS, PAD, PAD, PAD])
  # bos -> 5, 5 -> 6, 6 -> eos; eos and padding predict nothing.
  np.testing.assert_array_equal(example['weights'], [1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(example['padding_mask'], [True] * 4 + [False] * 2)


def test_next_token_targets_of_packed_documents():
  # The stream 5 6 7 eos 8: the eos between documents is predicted as a token.
  packed = packing.pack_documents([[5, 6, 7], [8]], 4, bos_id=BOS, eos_id=EOS, pad_id=PAD)
  examples = [causal_lm.NextTokenTargets(PAD).map(row) for row in packed]
  np.testing.assert_array_equal(
      [e['targets'] for e in examples], [[5, 6, EOS, PAD], [7, EOS, EOS, PAD], [8, EOS, PAD, PAD]]
  )
  np.testing.assert_array_equal(
      [e['weights'] for e in examples], [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]]
  )


def test_eval_batches_with_a_map_transform_drop_nothing():
  rng = np.random.default_rng(0)
  rows = rng.integers(4, 260, size=(21, 16)).astype(np.int32)
  rows[:, 0], rows[:, -1] = BOS, EOS
  rows[-1, 9], rows[-1, 10:] = EOS, PAD
  batches = packed_batches.create_eval_batches(
      rows, batch_size=4, seed=0, transform=causal_lm.NextTokenTargets(PAD), pad_id=PAD
  )
  assert len(batches) == 6
  stacked = {key: np.concatenate([b[key] for b in batches]) for key in KEYS}
  assert_next_token_batch(stacked, 16)
  np.testing.assert_array_equal(stacked['inputs'][:21], rows)
  assert not stacked['padding_mask'][21:].any() and not stacked['weights'][21:].any()
  assert stacked['weights'].sum() == 20 * 15 + 9


# Datasets from configs/tiny.py (the embedded corpus, byte tokens, n = 32).


def tiny_config(**data):
  config = tiny.get_config()
  config.data.update(data)
  return config


@pytest.fixture(scope='module')
def tiny_datasets(data_cache, tmp_path_factory):
  """(causal, masked) datasets of the whole tiny eval split, in fresh workdirs."""
  del data_cache  # the splits are prepared once, in the session's cache
  config = tiny_config(max_eval_batches=0)
  causal = causal_lm.build_datasets(typed(config), str(tmp_path_factory.mktemp('causal')))
  masked = masked_lm.build_datasets(typed(config), str(tmp_path_factory.mktemp('masked')))
  return causal, masked


def test_eval_batches_are_the_masked_lm_rows_shifted(tiny_datasets):
  causal, masked = tiny_datasets
  seq_len = tiny.get_config().model.max_len
  assert len(causal.eval_batches) == len(masked.eval_batches) > 1
  for causal_batch, masked_batch in zip(causal.eval_batches, masked.eval_batches):
    assert_next_token_batch(causal_batch, seq_len)
    np.testing.assert_array_equal(causal_batch['inputs'], masked_batch['targets'])
    np.testing.assert_array_equal(causal_batch['padding_mask'], masked_batch['padding_mask'])
  # Over the whole split: every real token but each row's final eos is a target.
  weights = sum(batch['weights'].sum() for batch in causal.eval_batches)
  assert weights == causal.eval_tokens - causal.eval_sequences
  assert (causal.eval_sequences, causal.eval_tokens) == (masked.eval_sequences, masked.eval_tokens)


def test_train_batches_are_the_masked_lm_rows_shifted(tiny_datasets):
  causal, masked = tiny_datasets
  seq_len = tiny.get_config().model.max_len
  # The same seed shuffles the same rows into the same batches.
  batches = zip(take(causal.train_iterator, 5), take(masked.train_iterator, 5))
  for causal_batch, masked_batch in batches:
    assert_next_token_batch(causal_batch, seq_len)
    np.testing.assert_array_equal(causal_batch['inputs'], masked_batch['targets'])
    assert (causal_batch['inputs'][:, 0] == BOS).all()


def test_mask_rate_is_not_read(tmp_path):
  # A rate the config edge refuses, put past it: the causal pipeline never reads it.
  settings = typed(tiny_config())
  settings = dataclasses.replace(settings, data=dataclasses.replace(settings.data, mask_rate=0.0))
  datasets = causal_lm.build_datasets(settings, str(tmp_path), train=False)
  assert datasets.train_iterator is None and datasets.eval_batches
  with pytest.raises(ValueError, match=r'config\.data\.mask_rate'):
    masked_lm.build_datasets(settings, str(tmp_path))


def test_train_iterator_is_deterministic_and_resumes_exactly(tmp_path):
  def iterator(seed=0):
    config = tiny_config()
    config.seed = seed
    return causal_lm.build_datasets(typed(config), str(tmp_path)).train_iterator

  first = take(iterator(), 6)
  assert_batches_equal(first, take(iterator(), 6))
  other = take(iterator(seed=1), 6)
  assert any((a['inputs'] != b['inputs']).any() for a, b in zip(first, other))
  running = iterator()
  take(running, 3)
  state = running.get_state()
  assert isinstance(state, bytes)
  expected = take(running, 4)
  assert_batches_equal(expected[:3], first[3:])
  restored = iterator()
  restored.set_state(state)
  assert_batches_equal(take(restored, 4), expected)
