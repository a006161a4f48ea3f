"""Labelled examples of a classification split, and the reader of TSV files.

`Examples` is what a classification source (`classification_sources`) gives
for a split: one tuple of 1 or 2 texts per example and their class indices.
`read_tsv` reads a file with a header row naming its columns; a missing
column, a label outside the labels or a malformed row is an error naming the
file and line. `classification` tokenizes the examples and makes batches of
them.
"""

import csv
import pathlib
import sys
from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from linformer_jax.errors import ConfigError


class Examples(NamedTuple):
  """The texts (one tuple of 1 or 2 strings per example) and class indices."""

  texts: List[Tuple[str, ...]]
  labels: np.ndarray


def _label_index(labels: Sequence[str]) -> Dict[str, int]:
  return {str(label): index for index, label in enumerate(labels)}


def read_tsv(
    path: pathlib.Path, text_columns: Sequence[str], label_column: str, labels: Sequence[str]
) -> Examples:
  """Examples of a TSV file with a header row naming its columns.

  Fields are taken literally (no quoting: GLUE's files contain bare quotes).
  A missing column, a label outside `labels` or text that is not UTF-8 is an
  error naming the file and, for a label or a byte, the line.
  """
  try:
    return _read_tsv(path, text_columns, label_column, labels)
  except UnicodeDecodeError:
    # The reader decodes blocks ahead of its rows: the line comes from the bytes.
    data = pathlib.Path(path).read_bytes()
    try:
      data.decode('utf-8')
    except UnicodeDecodeError as error:
      line_number = data.count(b'\n', 0, error.start) + 1
      raise ConfigError(
          f'{path}:{line_number}: byte 0x{data[error.start]:02x} is not UTF-8 text '
          f'({error.reason}); save the file as UTF-8.'
      ) from None
    raise


def _read_tsv(
    path: pathlib.Path, text_columns: Sequence[str], label_column: str, labels: Sequence[str]
) -> Examples:
  label_of = _label_index(labels)
  texts, label_ids = [], []
  csv.field_size_limit(sys.maxsize)
  with open(path, newline='', encoding='utf-8') as f:
    reader = csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None:
      raise ConfigError(f'{path} is empty; it needs a header row and examples.')
    missing = [c for c in (*text_columns, label_column) if c not in header]
    if missing:
      raise ConfigError(
          f'{path} has no column {", ".join(map(repr, missing))} (its columns: '
          f'{", ".join(header)}); set config.data.text_columns / label_column.'
      )
    text_at = [header.index(c) for c in text_columns]
    label_at = header.index(label_column)
    for line_number, row in enumerate(reader, start=2):
      if len(row) != len(header):
        raise ConfigError(f'{path}:{line_number}: {len(row)} fields, the header has {len(header)}.')
      label = row[label_at]
      if label not in label_of:
        raise ConfigError(
            f'{path}:{line_number}: label {label!r} is not in config.data.labels='
            f'{tuple(labels)}; add it there or fix the file.'
        )
      texts.append(tuple(row[i] for i in text_at))
      label_ids.append(label_of[label])
  if not texts:
    raise ConfigError(f'{path} has a header but no examples.')
  return Examples(texts, np.asarray(label_ids, np.int32))
