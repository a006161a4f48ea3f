"""A pretraining split as *units*: pieces of its documents small enough to hold
in memory, in the order they are packed.

A unit is ('texts', [documents]) (64 documents of the embedded corpus or of a
streamed TFDS dataset), ('file', path) (a text file, cut into documents as
`corpus.file_documents` does), ('block', path, index) (a 32 MiB block of a
larger file, cut at blank lines) or ('tfds', name, split, data_dir, text_key,
start, stop) (examples of a TFDS split stored as ArrayRecord, read with random
access: no pass over the dataset). Units are what preparation workers read
and tokenize, what hosts divide among themselves, and what the tokenizer's
training sample is drawn from.
"""

import os
import pathlib
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from linformer_jax.data import corpus

# Embedded and TFDS documents go to the workers in chunks of this many.
DOCUMENTS_PER_UNIT = 64
# A unit is ('texts', [documents]), ('file', path), ('block', path, index) or
# ('tfds', name, split, data_dir, text_key, start, stop): examples start..stop
# of a TFDS split stored as ArrayRecord, read with random access.
Unit = Tuple[Any, ...]


def unit_documents(unit: Unit) -> List[str]:
  """The documents of one unit (text files as `corpus.file_documents` cuts them)."""
  kind = unit[0]
  if kind == 'texts':
    return list(unit[1])
  if kind == 'file':
    return corpus.file_documents(pathlib.Path(unit[1]))
  if kind == 'block':
    return corpus.block_documents(pathlib.Path(unit[1]), unit[2])
  if kind == 'tfds':
    _, name, split, data_dir, text_key, start, stop = unit
    source = _tfds_source(name, split, data_dir)
    texts = (corpus.tfds_text(source[index], text_key) for index in range(start, stop))
    return [text for text in texts if text]
  raise ValueError(f'unknown unit {unit!r}')


_TFDS_SOURCES: Dict[Tuple[str, str, str], Any] = {}


def _tfds_source(name: str, split: str, data_dir: str) -> Any:
  """tfds.data_source of a split, opened once per process."""
  key = (name, split, data_dir)
  if key not in _TFDS_SOURCES:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    _TFDS_SOURCES[key] = tfds.data_source(
        name, split=split, data_dir=data_dir or None, download=False
    )
  return _TFDS_SOURCES[key]


def _tfds_array_record_units(data_config: Mapping[str, Any], split: str) -> Optional[List[Unit]]:
  """Index ranges of a TFDS split stored as ArrayRecord (no pass over it), or
  None when the dataset is in another format (then it streams once)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  name, data_dir = data_config['tfds_name'], data_config.get('tfds_data_dir') or ''
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except Exception:  # pylint: disable=broad-except
    return None  # iter_documents reports an unknown dataset in one line
  if not builder.is_prepared() or builder.info.file_format != tfds.core.FileFormat.ARRAY_RECORD:
    return None
  count = len(_tfds_source(name, split, data_dir))
  key = data_config.get('tfds_text_key') or 'text'
  return [
      ('tfds', name, split, data_dir, key, start, min(start + DOCUMENTS_PER_UNIT, count))
      for start in range(0, count, DOCUMENTS_PER_UNIT)
  ]


def _chunks(documents: Iterable[str]) -> Iterator[Unit]:
  chunk: List[str] = []
  for document in documents:
    chunk.append(document)
    if len(chunk) == DOCUMENTS_PER_UNIT:
      yield ('texts', chunk)
      chunk = []
  if chunk:
    yield ('texts', chunk)


def split_units(data_config: Mapping[str, Any], split: str) -> Iterator[Unit]:
  """The units of a split, in the order its documents are packed."""
  if data_config['source'] == 'text_files':
    for path in corpus.split_text_files(
        data_config['path'], split, data_config.get('split_files') or {}
    ):
      if path.stat().st_size <= corpus.FILE_BLOCK_BYTES:
        yield ('file', str(path))
      else:
        for index in range(corpus.file_blocks(path)):
          yield ('block', str(path), index)
    return
  if data_config['source'] == 'tfds' and data_config.get('tfds_name'):
    units = _tfds_array_record_units(data_config, split)
    if units is not None:
      yield from units
      return
  yield from _chunks(corpus.iter_documents(data_config, split))


def unit_size(unit: Unit) -> int:
  """Characters (or bytes on disk) of a unit, to budget samples."""
  if unit[0] == 'texts':
    return sum(len(text) for text in unit[1])
  if unit[0] == 'file':
    return os.path.getsize(unit[1])
  return corpus.FILE_BLOCK_BYTES


def sample_documents(
    data_config: Mapping[str, Any], split: str, max_chars: int, seed: int = 0
) -> Iterator[str]:
  """At most about `max_chars` of the split's documents, streamed.

  The whole split, in order, when it fits; otherwise whole units in a seeded
  random order until the budget is spent (only their sizes are held).
  """
  units = list(split_units(data_config, split)) if data_config['source'] == 'text_files' else None
  if units is None:
    # Documents stream from the source; take them in order up to the budget.
    used = 0
    for document in corpus.iter_documents(data_config, split):
      if used >= max_chars:
        return
      used += len(document)
      yield document
    return
  sizes = [unit_size(unit) for unit in units]
  order = (
      range(len(units))
      if sum(sizes) <= max_chars
      else np.random.default_rng(seed).permutation(len(units))
  )
  used = 0
  for index in order:
    if used >= max_chars:
      return
    used += sizes[index]
    yield from unit_documents(units[index])
