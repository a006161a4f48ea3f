"""Packed pretraining sequences: documents packed into rows of seq_len tokens,
and such rows as a grain data source.

Documents are tokenized and packed as in RoBERTa's FULL-SENTENCES setting: the
token streams of all documents, separated by eos, are cut into chunks of
seq_len - 2 tokens, and every sequence is `[bos] + chunk + [eos]`. Only the last
sequence of a split is padded (after its eos), so almost no position is wasted.
The language-modelling pipelines (`masked_lm`, `causal_lm`) read these rows and
differ only in the transform that makes a training example of each.
"""

import hashlib
from typing import Sequence

import grain
import numpy as np

from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.errors import ConfigError


def pack_documents(
    token_lists: Sequence[Sequence[int]], seq_len: int, *, bos_id: int, eos_id: int, pad_id: int
) -> np.ndarray:
  """Packs tokenized documents into an int32 array [num_sequences, seq_len].

  Concatenating the rows without their first token, their last eos and any
  padding gives back the documents joined by eos, token for token. It is the
  packing preparation streams (`prepare.Packer`), over a list in memory.
  """
  if seq_len < 3:
    raise ConfigError(
        f'config.model.max_len={seq_len} is too short: a sequence '
        'needs bos, eos and at least one token (use >= 3).'
    )
  packer = prepare.Packer(seq_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
  rows = [packer.add(np.asarray(tokens, np.int32)) for tokens in token_lists]
  rows.append(packer.finish())
  sequences = np.concatenate(rows)
  if not len(sequences):
    raise ConfigError(
        'The documents hold no tokens; check config.data.source and its path or dataset.'
    )
  return sequences


class PackedSequences(grain.sources.RandomAccessDataSource):
  """A grain data source over the rows of a packed [num_sequences, seq_len] array.

  Its repr holds a digest of the tokens: grain stores the repr in iterator
  states and refuses to restore one onto different data.
  """

  def __init__(self, sequences: np.ndarray):
    sequences = np.asarray(sequences)
    if sequences.ndim != 2 or not np.issubdtype(sequences.dtype, np.integer):
      raise ValueError(
          'Packed sequences must be an integer array [num, seq_len]; '
          f'got {sequences.dtype} {sequences.shape}.'
      )
    self._sequences = sequences.astype(np.int32, copy=False)
    self._digest = hashlib.sha256(np.ascontiguousarray(self._sequences).tobytes()).hexdigest()[:16]

  def __len__(self) -> int:
    return len(self._sequences)

  def __getitem__(self, index: int) -> np.ndarray:
    return self._sequences[index]

  def __repr__(self) -> str:
    return f'PackedSequences(shape={self._sequences.shape}, sha={self._digest})'


def as_source(sequences) -> grain.sources.RandomAccessDataSource:
  """Packed sequences as a grain source: an array [num, seq_len] in memory, or
  a source already (`shards.ShardedSequences` of a prepared split)."""
  if isinstance(sequences, (shards.ShardedSequences, PackedSequences)):
    return sequences
  return PackedSequences(sequences)
