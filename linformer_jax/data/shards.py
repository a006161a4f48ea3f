"""Prepared splits on disk: ArrayRecord shards of packed sequences and their manifests.

A prepared split is a folder holding, for each of its `part_count` parts (one
per preparing host), a manifest `part-I-of-N.json` and the shards that part
wrote, `part-I-of-N-shard-K.array_record`: one record per packed int32
sequence. A manifest records what the data depends on (`signature`: the
source, the tokenizer's fingerprint, seq_len), its shards with their sizes
and record counts, the sequence and token counts, the unigram counts of the
tokens (for the reference perplexity), and, while the part is being
prepared, where preparation resumes.

Shards are written under a `.tmp` name and renamed once closed, and the
manifest is rewritten atomically after each one, so a killed preparation
never leaves a half shard that looks complete. Reading checks every shard's
size and record count against the manifest (cheap: file sizes and footers),
so a truncated or missing shard is an error, not silently less data.
"""

import hashlib
import json
import os
import pathlib
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from array_record.python.array_record_module import ArrayRecordReader
from array_record.python.array_record_module import ArrayRecordWriter
import grain
import numpy as np

from linformer_jax.errors import ConfigError

MANIFEST_VERSION = 1
# Each record is read alone (random access), so each is its own chunk group.
WRITER_OPTIONS = 'group_size:1'
READER_OPTIONS = 'readahead_buffer_size:0'
READER_BUFFER_BYTES = 32768


def manifest_name(part_index: int, part_count: int) -> str:
  return f'part-{part_index}-of-{part_count}.json'


def shard_name(part_index: int, part_count: int, shard_index: int) -> str:
  return f'part-{part_index}-of-{part_count}-shard-{shard_index:05d}.array_record'


def write_json_atomically(path: pathlib.Path, payload: Mapping[str, Any]) -> None:
  temporary = path.with_name(f'{path.name}.tmp{os.getpid()}')
  temporary.write_text(json.dumps(payload, sort_keys=True))
  os.replace(temporary, path)


class ShardWriter:
  """Writes packed sequences to one shard under a temporary name."""

  def __init__(self, folder: pathlib.Path, name: str):
    self.path = folder / name
    self._temporary = folder / f'{name}.tmp'
    self._writer = ArrayRecordWriter(str(self._temporary), WRITER_OPTIONS)
    self.sequences = 0

  def write(self, rows: np.ndarray) -> None:
    for row in np.asarray(rows, np.int32):
      self._writer.write(row.tobytes())
    self.sequences += len(rows)

  def close(self) -> Dict[str, Any]:
    """Closes and renames the shard; returns its manifest entry."""
    self._writer.close()
    os.replace(self._temporary, self.path)
    return {'name': self.path.name, 'sequences': self.sequences, 'bytes': self.path.stat().st_size}


def read_records(path: pathlib.Path) -> Iterator[bytes]:
  """The records of one shard, in order."""
  reader = ArrayRecordReader(str(path))
  try:
    for start in range(0, reader.num_records(), 1024):
      yield from reader.read(start, min(start + 1024, reader.num_records()))
  finally:
    reader.close()


def remove_temporary_files(folder: pathlib.Path, part_index: int, part_count: int) -> None:
  """Deletes what a killed preparation of this part left half written (never
  another part's: other hosts may be writing theirs)."""
  prefix = f'part-{part_index}-of-{part_count}'
  for pattern in (f'{prefix}-shard-*.tmp', f'{prefix}.json.tmp*'):
    for path in folder.glob(pattern):
      path.unlink()


def read_manifest(path: pathlib.Path) -> Optional[Dict[str, Any]]:
  if not path.exists():
    return None
  try:
    manifest = json.loads(path.read_text())
  except ValueError as error:
    raise ConfigError(
        f'{path} is not a valid manifest ({error}); delete {path.parent} '
        'and prepare the data again.'
    ) from error
  if manifest.get('version') != MANIFEST_VERSION:
    raise ConfigError(
        f'{path} has manifest version {manifest.get("version")!r}, not '
        f'{MANIFEST_VERSION}; delete {path.parent} and prepare the data again.'
    )
  return manifest


def check_signature(
    manifest: Mapping[str, Any], signature: Mapping[str, Any], path: pathlib.Path
) -> None:
  """Refuses a manifest prepared from other data, tokenizer or seq_len."""
  stored = manifest.get('signature', {})
  for key in sorted(set(stored) | set(signature)):
    if stored.get(key) != signature.get(key):
      raise ConfigError(
          f'{path} was prepared with {key}={stored.get(key)!r}, not {signature.get(key)!r}; '
          'point config.data.prepared_dir at another folder, or delete this one to '
          'prepare it again.'
      )


class PreparedSplit:
  """The shards of a complete prepared split, checked against their manifests.

  Attributes:
    folder: the split's folder.
    paths: the shard files in reading order (part by part).
    sequences, tokens: totals over all parts.
    unigram_counts: [vocab_size] int64 occurrences of each token id.
    digest: a digest of all packed sequences in reading order (from the
      manifests; sha256 of their int32 bytes when there is one part).
  """

  def __init__(self, folder: pathlib.Path, signature: Mapping[str, Any]):
    self.folder = folder
    manifests = sorted(folder.glob('part-*-of-*.json'))
    if not manifests:
      raise ConfigError(
          f'{folder} holds no prepared data; run '
          '`python -m linformer_jax.prepare_data` with the same config.'
      )
    counts = {int(path.stem.split('-')[3]) for path in manifests}
    if len(counts) != 1:
      raise ConfigError(
          f'{folder} holds parts of preparations with {sorted(counts)} parts; '
          'delete the folder and prepare the data again.'
      )
    part_count = counts.pop()
    parts = []
    for index in range(part_count):
      path = folder / manifest_name(index, part_count)
      manifest = read_manifest(path)
      if manifest is None or not manifest.get('complete'):
        raise ConfigError(
            f'Part {index} of {part_count} in {folder} is not prepared yet; run '
            f'`python -m linformer_jax.prepare_data` for it (--part_index={index} '
            f'--part_count={part_count}).'
        )
      check_signature(manifest, signature, path)
      parts.append(manifest)
    self.paths: List[str] = []
    self.shard_sequences: List[int] = []
    for manifest in parts:
      for shard in manifest['shards']:
        path = folder / shard['name']
        size = path.stat().st_size if path.exists() else None
        if size != shard['bytes']:
          raise ConfigError(
              f'Shard {path} is missing or truncated ({size} bytes, the manifest says '
              f'{shard["bytes"]}); delete {folder} and prepare the data again.'
          )
        reader = ArrayRecordReader(str(path))
        records = reader.num_records()
        reader.close()
        if records != shard['sequences']:
          raise ConfigError(
              f'Shard {path} holds {records} sequences, the manifest says '
              f'{shard["sequences"]}; delete {folder} and prepare the data again.'
          )
        self.paths.append(str(path))
        self.shard_sequences.append(records)
    self.sequences = sum(manifest['sequences'] for manifest in parts)
    if not self.sequences:
      raise ConfigError(
          f'{folder} holds no sequences: the split has no text; check '
          'config.data.source and its path or dataset.'
      )
    self.tokens = sum(manifest['tokens'] for manifest in parts)
    self.unigram_counts = np.sum(
        [np.asarray(manifest['unigram_counts'], np.int64) for manifest in parts], axis=0
    )
    shas = [manifest['content_sha256'] for manifest in parts]
    self.digest = (
        shas[0] if len(shas) == 1 else hashlib.sha256(''.join(shas).encode()).hexdigest()
    )[:16]


class ShardedSequences(grain.sources.RandomAccessDataSource):
  """A grain data source over the packed sequences of a prepared split.

  Random access: a process reads only the records its sampler asks for, a
  batch's records with one read per shard (`__getitems__`), in the calling
  thread. grain's ArrayRecord source starts a thread pool for every batched
  read: 123 us a record in batches of 32, against 36 us read one by one, on 2
  cores. Readers open on first use
  (one per shard, shared by threads as grain shares them) and are not pickled:
  a grain worker process opens its own.

  Grain stores the repr in iterator states and refuses to restore one onto
  other data; it names the content, not the paths, so a run resumes from a
  cache that moved, and it is the repr the in-memory source of earlier
  versions gave the same sequences, so their checkpoints resume too.
  """

  def __init__(self, split: PreparedSplit, seq_len: int):
    self._paths = list(split.paths)
    # Record r is in shard searchsorted(ends, r, 'right'), at r - its start.
    self._ends = np.cumsum(split.shard_sequences)
    self._starts = self._ends - split.shard_sequences
    self._digest = split.digest
    self._length = int(self._ends[-1])
    self._seq_len = seq_len
    self._readers: List[Optional[ArrayRecordReader]] = [None] * len(self._paths)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self._length

  def _reader(self, shard: int) -> ArrayRecordReader:
    if self._readers[shard] is None:
      with self._lock:
        if self._readers[shard] is None:
          # As grain opens them: no read-ahead, since reads are random.
          self._readers[shard] = ArrayRecordReader(
              self._paths[shard], READER_OPTIONS, file_reader_buffer_size=READER_BUFFER_BYTES
          )
    return self._readers[shard]

  def __getitem__(self, index: int) -> np.ndarray:
    return self.__getitems__([index])[0]

  def __getitems__(self, indices: Sequence[int]) -> List[np.ndarray]:
    indices = np.asarray(indices, np.int64)
    if len(indices) and (indices.min() < 0 or indices.max() >= self._length):
      raise IndexError(f'Record indices must lie in [0, {self._length}).')
    shard_of = np.searchsorted(self._ends, indices, side='right')
    positions = indices - self._starts[shard_of]
    rows: List[Optional[np.ndarray]] = [None] * len(indices)
    for shard in np.unique(shard_of).tolist():
      where = np.flatnonzero(shard_of == shard)
      records = self._reader(shard).read(positions[where].tolist())
      for slot, record in zip(where.tolist(), records):
        rows[slot] = np.frombuffer(record, np.int32)
    return rows

  def __getstate__(self) -> Dict[str, Any]:
    state = dict(self.__dict__)
    state['_readers'] = [None] * len(self._paths)
    del state['_lock']
    return state

  def __setstate__(self, state: Dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def __repr__(self) -> str:
    return f'PackedSequences(shape={(self._length, self._seq_len)}, sha={self._digest})'
