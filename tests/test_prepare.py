"""Streaming preparation of pretraining splits (`prepare`), read back (`shards`).

Rows read back equal packing the loaded documents naively, for any shards, workers
or file blocks; a killed preparation resumes without redoing finished units; two
processes read disjoint records covering the split; splits prepared in parts; bad
input fails saying what to change; memory does not grow with the corpus.
"""

import collections
import concurrent.futures
import json
import pickle
import textwrap
import threading
import time

import numpy as np
import pytest

from configs import tiny
from linformer_jax.data import corpus
from linformer_jax.data import loaders
from linformer_jax.data import masked_lm
from linformer_jax.data import packed_batches
from linformer_jax.data import packing
from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import units as units_lib
from linformer_jax.data.sources import text_files
from linformer_jax.errors import ConfigError

BYTES = tokenizer_lib.ByteTokenizer()
SEQ_LEN = tiny.get_config().model.max_len  # 32: rows of 30 text tokens
# Words of the generated corpora; some are non-ASCII, so bytes != characters.
WORDS = (
    'the', 'of', 'and', 'to', 'in', 'is', 'was', 'for', 'on', 'that', 'with', 'by',
    'river', 'stone', 'lantern', 'orchard', 'café', 'naïve', 'größe', 'ἀλήθεια',
)  # fmt: skip


# ---------------------------------------------------------------- helpers


def random_text(rng, paragraphs, max_words=60, line_width=None):
  """Paragraphs of random words, separated by blank lines (hard-wrapped at
  `line_width` when given, as Gutenberg books are)."""
  blocks = []
  for _ in range(paragraphs):
    paragraph = ' '.join(rng.choice(WORDS, size=rng.integers(1, max_words)))
    blocks.append(textwrap.fill(paragraph, line_width) if line_width else paragraph)
  return '\n\n'.join(blocks) + '\n'


def write_corpus(folder, seed=0, train_files=4, paragraphs=(10, 60)):
  """A folder of train files 0.txt, 1.txt, ... and a validation file v.txt;
  file sizes vary from under one document (~4000 characters) to several."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  for name in [f'{index}.txt' for index in range(train_files)] + ['v.txt']:
    count = int(rng.integers(*paragraphs))
    (folder / name).write_text(random_text(rng, count, line_width=int(rng.choice([0, 72]))))
  return folder


def data_config(tmp_path, path, split_files=(('validation', ['v.txt']),)):
  """tiny's config.data, reading the text files at `path`."""
  data = tiny.get_config().data
  data.source = 'text_files'
  data.path = str(path)
  data.split_files = dict(split_files)
  data.prepared_dir = str(tmp_path / 'prepared')
  return data


def prepare_into(data, folder, split='train', seq_len=SEQ_LEN, **kwargs):
  """Prepares `split` into `folder` with the byte tokenizer; returns
  (signature, manifest)."""
  signature = prepare.split_signature(data, split, BYTES, seq_len)
  manifest = prepare.prepare_part(
      data, split, folder, tokenizer=BYTES, seq_len=seq_len, signature=signature, **kwargs
  )
  return signature, manifest


def read_rows(folder, signature):
  """Every row of a prepared split, read through `ShardedSequences`."""
  source = shards.ShardedSequences(shards.PreparedSplit(folder, signature), SEQ_LEN)
  return np.stack([source[index] for index in range(len(source))])


def pack(documents):
  """The naive reference: all documents tokenized and packed in memory."""
  return packing.pack_documents(
      BYTES.encode_all(documents),
      SEQ_LEN,
      bos_id=BYTES.bos_id,
      eos_id=BYTES.eos_id,
      pad_id=BYTES.pad_id,
  )


def unpacked_documents(rows):
  """The documents packed into `rows`, decoded: bos, the row's last eos and
  padding dropped, the stream cut at the eos between documents."""
  stream = []
  for row in rows:
    real = row[row != BYTES.pad_id]
    assert real[0] == BYTES.bos_id and real[-1] == BYTES.eos_id
    stream.extend(real[1:-1].tolist())
  documents, current = [], []
  for token in stream + [BYTES.eos_id]:
    if token == BYTES.eos_id:
      documents.append(BYTES.decode(current))
      current = []
    else:
      current.append(token)
  return documents


class Killed(Exception):
  """Stands for the process being killed."""


_TOKENIZE_UNIT = prepare.tokenize_unit


class CountingTokenizeUnit:
  """Stands in for `prepare.tokenize_unit`: records the units it is given and
  raises `Killed` on call number `fail_on_call`."""

  def __init__(self, fail_on_call=None):
    self.units = []
    self._fail_on_call = fail_on_call

  def __call__(self, unit, tokenizer=None):
    self.units.append(unit)
    if len(self.units) == self._fail_on_call:
      raise Killed()
    return _TOKENIZE_UNIT(unit, tokenizer)


@pytest.fixture
def text_data(tmp_path):
  """config.data over a small generated corpus (4 train files, v.txt)."""
  return data_config(tmp_path, write_corpus(tmp_path / 'texts'))


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize('sequences_per_shard', [8192, 7])
@pytest.mark.parametrize('split', ['train', 'validation'])
def test_prepared_rows_equal_packing_the_loaded_documents(
    tmp_path, text_data, split, sequences_per_shard
):
  """Rows read from the shards equal pack_documents of load_documents, and the
  manifest's counts are the reference's."""
  folder = tmp_path / 'prepared' / split
  signature, manifest = prepare_into(
      text_data, folder, split, sequences_per_shard=sequences_per_shard
  )
  expected = pack(corpus.load_documents(text_data, split))
  rows = read_rows(folder, signature)
  assert rows.dtype == np.int32
  np.testing.assert_array_equal(rows, expected)
  real = expected[expected != BYTES.pad_id]
  assert manifest['complete']
  assert manifest['sequences'] == len(expected)
  assert manifest['tokens'] == real.size
  np.testing.assert_array_equal(
      manifest['unigram_counts'], np.bincount(real, minlength=BYTES.vocab_size)
  )
  sizes = [shard['sequences'] for shard in manifest['shards']]
  assert sum(sizes) == len(expected)
  if sequences_per_shard < len(expected):
    # A shard closes after the unit that fills it; only the last may be short.
    assert len(sizes) > 1 and all(size >= sequences_per_shard for size in sizes[:-1])
  else:
    assert len(sizes) == 1


def test_batched_reads_equal_single_reads(tmp_path, text_data):
  """ShardedSequences.__getitems__ (grain's batched read) gives the rows [i]
  gives, across shard boundaries and in any order, also once pickled."""
  folder = tmp_path / 'prepared' / 'train'
  signature, _ = prepare_into(text_data, folder, sequences_per_shard=5)
  source = shards.ShardedSequences(shards.PreparedSplit(folder, signature), SEQ_LEN)
  order = np.random.default_rng(0).permutation(len(source)).tolist()
  batched = source.__getitems__(order)
  for index, row in zip(order, batched):
    np.testing.assert_array_equal(row, source[index])
  # A grain worker process gets a pickled copy, which opens its own readers.
  copy = pickle.loads(pickle.dumps(source))
  assert repr(copy) == repr(source)
  np.testing.assert_array_equal(np.stack(copy.__getitems__(order)), np.stack(batched))
  with pytest.raises(IndexError):
    source.__getitems__([len(source)])


@pytest.mark.slow
def test_spawned_workers_give_the_rows_of_tokenizing_here(tmp_path, text_data):
  """workers=2 (spawned processes) writes the same rows and digest as workers=0."""
  here, there = tmp_path / 'here', tmp_path / 'workers'
  signature, _ = prepare_into(text_data, here, sequences_per_shard=9, workers=0)
  prepare_into(text_data, there, sequences_per_shard=9, workers=2)
  np.testing.assert_array_equal(read_rows(there, signature), read_rows(here, signature))
  assert (
      shards.PreparedSplit(there, signature).digest == shards.PreparedSplit(here, signature).digest
  )


def test_a_file_larger_than_a_block_keeps_every_paragraph_in_order(tmp_path, monkeypatch):
  """A file read in blocks (cut at blank lines) gives back every paragraph,
  in order, each whole: no paragraph is split or lost at a block edge."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  (folder / 'big.txt').write_text(random_text(np.random.default_rng(1), 400, line_width=72))
  data = data_config(tmp_path, folder, split_files={})
  monkeypatch.setattr(text_files, 'FILE_BLOCK_BYTES', 3000)
  assert len(list(units_lib.split_units(data, 'train'))) > 10
  prepared = tmp_path / 'prepared'
  signature, _ = prepare_into(data, prepared, sequences_per_shard=50)
  documents = unpacked_documents(read_rows(prepared, signature))
  expected = corpus.load_documents(data, 'train')
  assert '\n'.join(documents).split('\n') == '\n'.join(expected).split('\n')


def test_a_file_larger_than_a_block_packs_as_load_documents_does(tmp_path, monkeypatch):
  """A file read in blocks gives the rows packing its load_documents gives."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  (folder / 'big.txt').write_text(random_text(np.random.default_rng(1), 400))
  data = data_config(tmp_path, folder, split_files={})
  monkeypatch.setattr(text_files, 'FILE_BLOCK_BYTES', 3000)
  prepared = tmp_path / 'prepared'
  signature, _ = prepare_into(data, prepared)
  np.testing.assert_array_equal(
      read_rows(prepared, signature), pack(corpus.load_documents(data, 'train'))
  )


def test_a_crlf_file_larger_than_a_block_is_read_a_block_at_a_time(tmp_path, monkeypatch):
  """Each unit of a large Windows-newline file holds about one block of text,
  so memory stays bounded for it too."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  text = random_text(np.random.default_rng(2), 300)
  (folder / 'big.txt').write_bytes(text.replace('\n', '\r\n').encode())
  data = data_config(tmp_path, folder, split_files={})
  monkeypatch.setattr(text_files, 'FILE_BLOCK_BYTES', 3000)
  sizes = [
      len('\n'.join(units_lib.unit_documents(unit)))
      for unit in units_lib.split_units(data, 'train')
  ]
  assert sum(sizes) > 10 * 3000
  assert max(sizes) <= 2 * 3000


# ---------------------------------------------------------------- resuming


def test_a_killed_preparation_resumes_without_redoing_finished_units(tmp_path, monkeypatch):
  """Stopped while tokenizing unit 6 of 8, preparation leaves only whole,
  listed shards (and a .tmp one); run again, it tokenizes only the units after
  the last finished shard and writes the rows of an uninterrupted run."""
  data = data_config(tmp_path, write_corpus(tmp_path / 'texts', seed=3, train_files=8))
  all_units = list(units_lib.split_units(data, 'train'))
  assert len(all_units) == 8
  whole, folder = tmp_path / 'whole', tmp_path / 'killed'
  signature, _ = prepare_into(data, whole, sequences_per_shard=400)

  killed = CountingTokenizeUnit(fail_on_call=6)
  monkeypatch.setattr(prepare, 'tokenize_unit', killed)
  with pytest.raises(Killed):
    prepare_into(data, folder, sequences_per_shard=400)
  manifest = json.loads((folder / shards.manifest_name(0, 1)).read_text())
  assert not manifest['complete']
  done = manifest['units_done']
  # Shards close after units 2 and 4 (about 250 rows each); unit 5's rows
  # were going to an open shard, which has a .tmp name.
  assert done == 4 and len(manifest['shards']) == 2
  assert list(folder.glob('*.array_record.tmp'))
  # Every file under a shard's own name is listed and whole.
  listed = {shard['name']: shard['bytes'] for shard in manifest['shards']}
  on_disk = {path.name: path.stat().st_size for path in folder.glob('*.array_record')}
  assert on_disk == listed
  assert manifest['sequences'] == sum(shard['sequences'] for shard in manifest['shards'])
  with pytest.raises(ConfigError, match='Part 0 of 1 .* is not prepared yet'):
    shards.PreparedSplit(folder, signature)

  resumed = CountingTokenizeUnit()
  monkeypatch.setattr(prepare, 'tokenize_unit', resumed)
  prepare_into(data, folder, sequences_per_shard=400)
  assert resumed.units == all_units[done:]
  assert not list(folder.glob('*.tmp*'))
  np.testing.assert_array_equal(read_rows(folder, signature), read_rows(whole, signature))
  again, reference = shards.PreparedSplit(folder, signature), shards.PreparedSplit(whole, signature)
  assert (again.digest, again.sequences, again.tokens) == (
      reference.digest,
      reference.sequences,
      reference.tokens,
  )
  np.testing.assert_array_equal(again.unigram_counts, reference.unigram_counts)

  # A complete part is returned as it is, nothing tokenized.
  finished = CountingTokenizeUnit()
  monkeypatch.setattr(prepare, 'tokenize_unit', finished)
  prepare_into(data, folder, sequences_per_shard=400)
  assert not finished.units


# ---------------------------------------------------------------- reading


def test_two_processes_read_disjoint_records_that_cover_the_split(tmp_path):
  """Over one epoch, process 0 and process 1 of 2 read disjoint records whose
  union is every record of the prepared split."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  # One document of 32 rows * 30 tokens; counting words makes every row unique.
  text = ' '.join(f'w{index:05d}' for index in range(200))[: 32 * (SEQ_LEN - 2)]
  (folder / 'counting.txt').write_text(text + '\n')
  data = data_config(tmp_path, folder, split_files={})
  prepared = tmp_path / 'prepared'
  signature, _ = prepare_into(data, prepared, sequences_per_shard=10)
  source = shards.ShardedSequences(shards.PreparedSplit(prepared, signature), SEQ_LEN)
  all_rows = {source[index].tobytes() for index in range(len(source))}
  assert len(source) == len(all_rows) == 32

  batch_size = 4
  seen = []
  for process_index in range(2):
    iterator = packed_batches.create_train_iterator(
        source,
        loaders.LoaderSettings(
            batch_size=batch_size, seed=0, process_index=process_index, process_count=2
        ),
        masked_lm.DynamicMasking(BYTES, 0.15),
    )
    epoch = len(source) // 2 // batch_size
    rows = [row.tobytes() for _ in range(epoch) for row in next(iterator)['targets']]
    assert len(set(rows)) == len(rows) == len(source) // 2
    seen.append(set(rows))
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == all_rows


# ---------------------------------------------------------------- parts


def test_a_split_prepared_in_two_parts_reads_as_the_whole(tmp_path, text_data):
  """Part I of 2 packs files I, I + 2, ...; the split is unreadable (naming the
  missing part) until both are there; then it reads part 0's rows, then part
  1's, and their documents are the split's."""
  folder = tmp_path / 'prepared' / 'train'
  files = text_files.split_text_files(text_data.path, 'train', text_data.split_files)
  assert len(files) == 4
  signature, first = prepare_into(
      text_data, folder, sequences_per_shard=6, part_index=0, part_count=2
  )
  with pytest.raises(ConfigError, match=r'Part 1 of 2 .*--part_index=1 --part_count=2'):
    shards.PreparedSplit(folder, signature)
  _, second = prepare_into(text_data, folder, sequences_per_shard=6, part_index=1, part_count=2)

  per_part = [
      pack([doc for path in files[index::2] for doc in text_files.file_documents(path)])
      for index in range(2)
  ]
  rows = read_rows(folder, signature)
  np.testing.assert_array_equal(rows, np.concatenate(per_part))
  assert [first['sequences'], second['sequences']] == [len(part) for part in per_part]
  prepared = shards.PreparedSplit(folder, signature)
  assert prepared.sequences == len(rows)
  assert prepared.tokens == int(np.sum(rows != BYTES.pad_id))
  assert collections.Counter(
      unpacked_documents(per_part[0]) + unpacked_documents(per_part[1])
  ) == collections.Counter(corpus.load_documents(text_data, 'train'))


def test_parts_prepared_at_the_same_time_leave_each_other_alone(tmp_path, text_data, monkeypatch):
  """Part 1 starting while part 0 is writing a shard (two hosts sharing the
  folder) lets part 0 finish, and the split reads whole."""
  folder = tmp_path / 'prepared' / 'train'
  signature = prepare.split_signature(text_data, 'train', BYTES, SEQ_LEN)
  calls = []

  def tokenize_and_start_part_one(unit, tokenizer=None):
    calls.append(unit)
    if len(calls) == 2:
      # Part 0 has a shard open (its first unit's rows); the other host starts.
      assert list(folder.glob('part-0-of-2-*.tmp'))
      prepare_into(text_data, folder, sequences_per_shard=1000, part_index=1, part_count=2)
    return _TOKENIZE_UNIT(unit, tokenizer)

  monkeypatch.setattr(prepare, 'tokenize_unit', tokenize_and_start_part_one)
  prepare_into(text_data, folder, sequences_per_shard=1000, part_index=0, part_count=2)
  assert shards.PreparedSplit(folder, signature).sequences > 0


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize('damage', ['truncated', 'missing'])
def test_a_damaged_shard_is_refused_naming_it(tmp_path, text_data, damage):
  """A shard cut short or deleted is a ConfigError naming the shard and what
  to do, not silently less data."""
  folder = tmp_path / 'prepared' / 'train'
  signature, manifest = prepare_into(text_data, folder, sequences_per_shard=7)
  shard = folder / manifest['shards'][1]['name']
  if damage == 'missing':
    shard.unlink()
  else:
    shard.write_bytes(shard.read_bytes()[:-10])
  with pytest.raises(ConfigError, match='missing or truncated') as error:
    shards.PreparedSplit(folder, signature)
  message = str(error.value)
  assert str(shard) in message and 'prepare the data again' in message
  assert '\n' not in message


def test_a_split_prepared_with_another_tokenizer_or_seq_len_is_refused(tmp_path, text_data):
  """Reading or preparing into a folder prepared with another tokenizer or
  seq_len is a ConfigError naming the differing field and the way out."""
  folder = tmp_path / 'prepared' / 'train'
  signature, _ = prepare_into(text_data, folder)
  other_tokenizer = {**signature, 'tokenizer': 'SentencePieceTokenizer(vocab_size=8000, sha=0)'}
  with pytest.raises(ConfigError, match=r"tokenizer='ByteTokenizer\(\)'.*prepared_dir"):
    shards.PreparedSplit(folder, other_tokenizer)
  other_len = prepare.split_signature(text_data, 'train', BYTES, 64)
  with pytest.raises(ConfigError, match=r'seq_len=32, not 64.*prepared_dir'):
    shards.PreparedSplit(folder, other_len)
  # A run with another max_len and the same config.data.prepared_dir.
  with pytest.raises(ConfigError, match=r'seq_len=32, not 64.*prepared_dir'):
    prepare.prepared_split(text_data, 'train', tokenizer=BYTES, seq_len=64)


def test_an_empty_corpus_is_refused(tmp_path):
  """A split whose only file is whitespace fails preparation, naming
  config.data.source."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  (folder / 'blank.txt').write_text('  \n\n\t\n   \n')
  data = data_config(tmp_path, folder, split_files={})
  with pytest.raises(ConfigError, match="Split 'train' holds no tokens.*config.data.source"):
    prepare_into(data, tmp_path / 'prepared')


def test_an_empty_corpus_prepared_in_parts_is_refused(tmp_path):
  """A whitespace-only split prepared by two hosts is a ConfigError naming
  config.data.source when read, not an error from inside grain."""
  folder = tmp_path / 'texts'
  folder.mkdir()
  for name in ('a.txt', 'b.txt'):
    (folder / name).write_text('\n \n\n')
  data = data_config(tmp_path, folder, split_files={})
  prepared = tmp_path / 'prepared'
  for part_index in range(2):
    signature, _ = prepare_into(data, prepared, part_index=part_index, part_count=2)
  with pytest.raises(ConfigError, match='config.data.source'):
    shards.ShardedSequences(shards.PreparedSplit(prepared, signature), SEQ_LEN)


def test_a_missing_path_or_unprepared_folder_is_refused(tmp_path):
  """A data path that does not exist, an empty prepared folder and a corrupt
  manifest are each a ConfigError saying what to change."""
  data = data_config(tmp_path, tmp_path / 'nowhere', split_files={})
  with pytest.raises(ConfigError, match=r'config.data.path=.*nowhere.* does not exist'):
    prepare.prepared_split(data, 'train', tokenizer=BYTES, seq_len=SEQ_LEN)
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ConfigError, match='holds no prepared data; run `python -m'):
    shards.PreparedSplit(empty, {})
  (empty / shards.manifest_name(0, 1)).write_text('{"version": 1, "comp')
  with pytest.raises(ConfigError, match='is not a valid manifest.*prepare the data again'):
    shards.PreparedSplit(empty, {})


def test_two_runs_preparing_one_split_at_once_wait_for_each_other(tmp_path, text_data, monkeypatch):
  """Two runs sharing a cache reach the same unprepared split together: one
  prepares, the other waits and reads the same rows."""
  started = threading.Barrier(2)

  def slow_tokenize(unit, tokenizer=None):
    time.sleep(0.02)  # both preparations would be mid-shard at once
    return _TOKENIZE_UNIT(unit, tokenizer)

  def run():
    started.wait()
    return prepare.prepared_split(text_data, 'train', tokenizer=BYTES, seq_len=SEQ_LEN)

  monkeypatch.setattr(prepare, 'tokenize_unit', slow_tokenize)
  monkeypatch.setattr(prepare, 'workers_of', lambda data_config: 0)  # tokenize here
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    futures = [pool.submit(run) for _ in range(2)]
  results = [future.result() for future in futures]  # raises either run's error
  signature = prepare.split_signature(text_data, 'train', BYTES, SEQ_LEN)
  first, second = (read_rows(split.folder, signature) for split in results)
  np.testing.assert_array_equal(first, second)
  assert len(first) == results[0].sequences > 0
