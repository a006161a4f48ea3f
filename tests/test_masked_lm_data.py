"""The masked-LM data pipeline: packing, masking, grain iterators, evaluation
batches and datasets built from a config (corpora and tokenizers: test_corpus.py).

Token and sequence counts are worked out from the documents themselves (bytes,
separators, rows of max_len - 2 tokens), not read back from the pipeline.
"""

import math

import numpy as np
import pytest
from run_helpers import typed

from configs import tiny
from linformer_jax.data import loaders
from linformer_jax.data import masked_lm
from linformer_jax.data import packed_batches
from linformer_jax.data import packing
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data.sources import text_files
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_config

BYTES = tokenizer_lib.ByteTokenizer()


def random_documents(seed, count=40, max_len=90):
  rng = np.random.default_rng(seed)
  return [rng.integers(4, 260, size=rng.integers(1, max_len)).tolist() for _ in range(count)]


def unpack(sequences, pad_id, bos_id, eos_id):
  """Inverse of pack_documents: the eos-joined stream of document tokens."""
  stream = []
  for row in sequences:
    assert row[0] == bos_id
    real = row[row != pad_id]
    assert real[-1] == eos_id
    stream.extend(real[1:-1].tolist())
  return stream


def unique_sequences(count, seq_len=16):
  """Packed-like rows whose second token is the row number (rows are distinct)."""
  rng = np.random.default_rng(count)
  rows = rng.integers(4, 260, size=(count, seq_len)).astype(np.int32)
  rows[:, 0], rows[:, -1] = BYTES.bos_id, BYTES.eos_id
  rows[:, 1] = 4 + np.arange(count) % 256
  rows[:, 2] = 4 + np.arange(count) // 256
  return rows


def row_ids(batch):
  targets = batch['targets']
  return set(((targets[:, 1] - 4) + 256 * (targets[:, 2] - 4)).tolist())


def take(iterator, count):
  return [next(iterator) for _ in range(count)]


def assert_batches_equal(first, second):
  assert len(first) == len(second)
  for a, b in zip(first, second):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def train_iterator(sequences, seed=0, batch_size=8, **kwargs):
  return packed_batches.create_train_iterator(
      sequences,
      loaders.LoaderSettings(batch_size=batch_size, seed=seed, **kwargs),
      masked_lm.DynamicMasking(BYTES, 0.15),
  )


# Packing.


def test_packing_a_hand_worked_example():
  # The stream 5 6 7 eos 8 in rows of 4 - 2 tokens between bos and eos.
  packed = packing.pack_documents([[5, 6, 7], [8]], 4, bos_id=1, eos_id=2, pad_id=0)
  np.testing.assert_array_equal(packed, [[1, 5, 6, 2], [1, 7, 2, 2], [1, 8, 2, 0]])


@pytest.mark.parametrize('seq_len', [3, 16, 37])
def test_packing_round_trips_the_token_stream(seq_len):
  documents = random_documents(seed=seq_len)
  packed = packing.pack_documents(documents, seq_len, bos_id=1, eos_id=2, pad_id=0)
  expected = []
  for index, document in enumerate(documents):
    expected += ([2] if index else []) + document
  assert packed.dtype == np.int32 and packed.shape[1] == seq_len
  assert packed.shape[0] == -(-len(expected) // (seq_len - 2))
  assert unpack(packed, 0, 1, 2) == expected
  # Only the last sequence may be padded.
  assert not (packed[:-1] == 0).any()


def test_packing_rejects_too_short_sequences_and_empty_input():
  with pytest.raises(ValueError, match='config.model.max_len'):
    packing.pack_documents([[5, 6]], 2, bos_id=1, eos_id=2, pad_id=0)
  with pytest.raises(ValueError, match='no tokens'):
    packing.pack_documents([[]], 8, bos_id=1, eos_id=2, pad_id=0)


# Masking.


@pytest.mark.parametrize('whole_batch', [False, True])
def test_masking_rate_and_80_10_10_split(whole_batch):
  """The same distribution whether rows are masked one by one (evaluation) or
  a whole batch at once (the training loader)."""
  packed = packing.pack_documents(
      random_documents(0, count=3000), 128, bos_id=1, eos_id=2, pad_id=0
  )
  masking = masked_lm.DynamicMasking(BYTES, 0.15)
  if whole_batch:
    batch = masking.random_map(packed, np.random.default_rng(0))
  else:
    examples = [masking.random_map(row, np.random.default_rng(i)) for i, row in enumerate(packed)]
    batch = {key: np.stack([e[key] for e in examples]) for key in examples[0]}
  # Each row's count is its candidates times the rate, randomly rounded.
  expected = 0.15 * (~np.isin(packed, BYTES.special_ids)).sum(axis=1)
  counts = batch['weights'].sum(axis=1)
  assert np.all((counts == np.floor(expected)) | (counts == np.ceil(expected)))
  inputs, targets, weights = batch['inputs'], batch['targets'], batch['weights']
  np.testing.assert_array_equal(targets, packed)
  np.testing.assert_array_equal(batch['padding_mask'], packed != 0)
  text = ~np.isin(targets, BYTES.special_ids)
  chosen = weights == 1.0
  assert set(np.unique(weights)) <= {0.0, 1.0}
  assert text.sum() > 100_000
  assert abs(chosen.sum() / text.sum() - 0.15) < 0.005
  # Padding, bos and eos are never chosen; unchosen positions are untouched.
  assert not (chosen & ~text).any()
  np.testing.assert_array_equal(inputs[~chosen], targets[~chosen])
  masked = chosen & (inputs == BYTES.mask_id)
  replaced = chosen & (inputs != BYTES.mask_id) & (inputs != targets)
  kept = chosen & (inputs == targets)
  assert abs(masked.sum() / chosen.sum() - 0.8) < 0.02
  # A random replacement equals the original token 1 time in 256.
  assert abs(replaced.sum() / chosen.sum() - 0.1 * 255 / 256) < 0.015
  assert abs(kept.sum() / chosen.sum() - 0.1 * 257 / 256) < 0.015
  assert not np.isin(inputs[replaced], BYTES.special_ids).any()


@pytest.mark.parametrize(
    'seq_len,mask_rate', [(3, 0.15), (16, 0.15), (128, 0.15), (37, 0.3), (64, 0.9)]
)
def test_max_predictions_bounds_the_masked_count_of_every_row(seq_len, mask_rate):
  bound = masked_lm.max_predictions(seq_len, mask_rate)
  masking = masked_lm.DynamicMasking(BYTES, mask_rate)
  row = np.full([seq_len], 100, np.int32)
  row[0], row[-1] = BYTES.bos_id, BYTES.eos_id
  counts = [masking.random_map(row, np.random.default_rng(i))['weights'].sum() for i in range(400)]
  # Never exceeded; randomized rounding reaches ceil(mask_rate * (seq_len - 2)).
  assert max(counts) == math.ceil(mask_rate * (seq_len - 2)) <= bound


def test_bad_mask_rate_names_the_field():
  with pytest.raises(ValueError, match='config.data.mask_rate'):
    masked_lm.DynamicMasking(BYTES, 1.5)


# Training iterator.


def test_train_batches_have_the_documented_dtypes_and_shapes():
  batch = next(train_iterator(unique_sequences(50), batch_size=4))
  assert batch['inputs'].dtype == np.int32 and batch['inputs'].shape == (4, 16)
  assert batch['targets'].dtype == np.int32
  assert batch['weights'].dtype == np.float32
  assert batch['padding_mask'].dtype == bool


def test_same_seed_gives_identical_batches_and_other_seeds_differ():
  sequences = unique_sequences(64)
  first = take(train_iterator(sequences, seed=3), 10)
  assert_batches_equal(first, take(train_iterator(sequences, seed=3), 10))
  other = take(train_iterator(sequences, seed=4), 10)
  assert any((a['inputs'] != b['inputs']).any() for a, b in zip(first, other))


def test_every_epoch_sees_every_record_masked_differently():
  sequences = unique_sequences(24)
  epochs = take(train_iterator(sequences, batch_size=8), 6)
  first, second = epochs[:3], epochs[3:]
  assert set().union(*map(row_ids, first)) == set(range(24))
  assert set().union(*map(row_ids, second)) == set(range(24))
  by_row = lambda batches: {
      int(r[1]) + 256 * int(r[2]): w.tobytes()
      for b in batches
      for r, w in zip(b['targets'], b['weights'])
  }
  masks_1, masks_2 = by_row(first), by_row(second)
  assert sum(masks_1[k] != masks_2[k] for k in masks_1) > 20


def test_restored_iterator_continues_exactly():
  sequences = unique_sequences(30)  # 30 / 8: batches straddle epochs
  iterator = train_iterator(sequences)
  take(iterator, 5)
  state = iterator.get_state()
  assert isinstance(state, bytes)
  expected = take(iterator, 7)
  restored = train_iterator(sequences)
  restored.set_state(state)
  assert_batches_equal(take(restored, 7), expected)


def test_state_is_refused_on_different_data():
  sequences = unique_sequences(30)
  iterator = train_iterator(sequences)
  next(iterator)
  changed = sequences.copy()
  changed[7, 5] += 1
  other = train_iterator(changed)
  with pytest.raises(ConfigError, match='resume it with the same data'):
    other.set_state(iterator.get_state())


def test_two_processes_read_disjoint_shards():
  sequences = unique_sequences(40)
  seen = []
  for process_index in range(2):
    iterator = train_iterator(sequences, batch_size=4, process_index=process_index, process_count=2)
    seen.append(set().union(*map(row_ids, take(iterator, 5))))  # one epoch
  assert len(seen[0]) == len(seen[1]) == 20
  assert not seen[0] & seen[1]


def test_bad_process_settings_raise():
  with pytest.raises(ValueError, match='process_index'):
    train_iterator(unique_sequences(8), process_index=2, process_count=2)
  with pytest.raises(ValueError, match='config.seed'):
    train_iterator(unique_sequences(8), seed=-1)


# Evaluation batches.


def test_eval_batches_are_deterministic_and_drop_nothing():
  sequences = unique_sequences(21)
  make = lambda **kw: packed_batches.create_eval_batches(
      sequences,
      batch_size=4,
      seed=0,
      transform=masked_lm.DynamicMasking(BYTES, 0.15),
      pad_id=BYTES.pad_id,
      **kw,
  )
  batches = make()
  assert_batches_equal(batches, make())
  assert len(batches) == 6
  stacked = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  np.testing.assert_array_equal(stacked['targets'][:21], sequences)
  assert not stacked['padding_mask'][21:].any()
  assert not stacked['weights'][21:].any()
  # 14 maskable tokens a row (all but bos and eos) at rate 0.15: 2.1, rounded
  # at random to 2 or 3 positions.
  assert set(stacked['weights'][:21].sum(axis=1)) <= {2.0, 3.0}
  assert len(make(max_batches=2)) == 2


def test_eval_shards_have_equal_batch_counts_and_the_same_masks():
  sequences = unique_sequences(21)
  make = lambda index, count: packed_batches.create_eval_batches(
      sequences,
      batch_size=4,
      seed=0,
      transform=masked_lm.DynamicMasking(BYTES, 0.15),
      pad_id=BYTES.pad_id,
      process_index=index,
      process_count=count,
  )
  whole = {
      int(r[1]): w.tobytes()
      for b in make(0, 1)
      for r, w, m in zip(b['targets'], b['weights'], b['padding_mask'])
      if m.any()
  }
  shards = [make(index, 2) for index in range(2)]
  assert len(shards[0]) == len(shards[1]) == 3
  parts = [
      {
          int(r[1]): w.tobytes()
          for b in shard
          for r, w, m in zip(b['targets'], b['weights'], b['padding_mask'])
          if m.any()
      }
      for shard in shards
  ]
  assert not parts[0].keys() & parts[1].keys()
  assert {**parts[0], **parts[1]} == whole


# The whole pipeline from a config.


def small_config(tmp_path, books, **data):
  """configs/tiny.py (byte tokens, batches of 4) on the two books at n = 64."""
  config = tiny.get_config()
  config.model.max_len = 64
  config.data.update(
      {
          'source': 'text_files',
          'path': str(books),
          'split_files': {'validation': ['b.txt']},
          'tokenizer': 'byte',
          'cache_dir': str(tmp_path / 'cache'),
          'max_eval_batches': 0,
          **data,
      }
  )
  return run_config.complete(config)


def test_build_datasets_from_text_files(tmp_path, books):
  config = small_config(tmp_path, books)
  datasets = masked_lm.build_datasets(typed(config), str(tmp_path / 'run'))
  validation = text_files.text_file_documents(
      config.data.path, 'validation', config.data.split_files
  )
  # Every byte and one eos between documents, in rows of 64 - 2 tokens; each
  # row adds bos and eos; 4 rows a batch.
  stream = sum(len(doc.encode()) for doc in validation) + len(validation) - 1
  sequences = math.ceil(stream / 62)
  assert datasets.eval_sequences == sequences
  assert datasets.eval_tokens == stream + 2 * sequences
  assert datasets.train_tokens > datasets.eval_tokens
  assert len(datasets.eval_batches) == math.ceil(sequences / 4)
  batch = next(datasets.train_iterator)
  assert batch['inputs'].shape == (4, 64)
  assert 'Book b ' not in BYTES.decode(batch['targets'].ravel())
  assert len(list((tmp_path / 'cache' / 'prepared').glob('*/part-0-of-1.json'))) == 2
  again = masked_lm.build_datasets(typed(config), str(tmp_path / 'run'))
  assert_batches_equal(again.eval_batches, datasets.eval_batches)
  assert_batches_equal([next(again.train_iterator)], [batch])


@pytest.mark.parametrize(
    'field,value',
    [
        ('data.source', 'web'),
        ('data.mask_rate', 0.0),
        ('data.tokenizer', 'bpe'),
        ('data.eval_split', 'test'),
        ('data.path', '/nonexistent/books'),
        ('model.max_len', 2),
        ('model.vocab_size', 8000),
        ('batch_size', 0),
        ('seed', 2**32),
        ('data.worker_count', -1),
        ('data.read_threads', -1),
        ('data.prefetch_buffer', -2),
    ],
)
def test_build_datasets_names_the_bad_field(tmp_path, field, value, books):
  config = small_config(tmp_path, books)
  section, _, name = field.rpartition('.')
  (config[section] if section else config)[name] = value
  if field == 'model.max_len':  # k <= n, so that the data, not the model, refuses n
    config.model.projected_len = value
  message = {'data.eval_split': 'split_files'}.get(field, field)
  with pytest.raises(ValueError, match=message.replace('.', r'\.')):
    masked_lm.build_datasets(typed(config), str(tmp_path / 'run'))


def test_build_datasets_checks_the_batch_divides_among_processes(tmp_path, books):
  config = small_config(tmp_path, books, mask_rate=0.15)
  config.batch_size = 6
  with pytest.raises(ValueError, match='config.batch_size'):
    masked_lm.build_datasets(typed(config), str(tmp_path / 'run'), process_index=0, process_count=4)
