"""Packed pretraining sequences: documents packed into rows of seq_len tokens,
and such rows as a grain data source.

Documents are tokenized and packed as in RoBERTa's FULL-SENTENCES setting: the
token streams of all documents, separated by eos, are cut into chunks of
seq_len - 2 tokens, and every sequence is `[bos] + chunk + [eos]`. Only the last
sequence of a split is padded (after its eos), so almost no position is wasted.
`Packer` packs a stream (preparation writes its rows to shards);
`pack_documents` packs a list in memory the same way. The pretraining pipeline
(`pretraining`) reads these rows; `masked_lm` and `causal_lm` differ only in
the transform that makes a training example of each.
"""

import hashlib
from typing import Sequence

import grain
import numpy as np

from linformer_jax.data import shards
from linformer_jax.errors import ConfigError


class Packer:
  """RoBERTa's FULL-SENTENCES packing, streamed: documents joined by eos, cut
  into rows of bos + seq_len - 2 tokens + eos; the last row padded."""

  def __init__(
      self,
      seq_len: int,
      *,
      bos_id: int,
      eos_id: int,
      pad_id: int,
      carry: Sequence[int] = (),
      started: bool = False,
  ):
    self.chunk = seq_len - 2
    self.seq_len = seq_len
    self.bos, self.eos, self.pad = bos_id, eos_id, pad_id
    self.carry = np.asarray(carry, np.int32)
    self.started = started

  def add(self, stream: np.ndarray) -> np.ndarray:
    """Appends a unit's stream (eos before it unless first); returns full rows."""
    if not stream.size:
      return np.zeros([0, self.seq_len], np.int32)
    head = [np.array([self.eos], np.int32)] if self.started else []
    self.started = True
    tokens = np.concatenate([self.carry, *head, stream])
    full = tokens.size // self.chunk
    self.carry = tokens[full * self.chunk :]
    rows = np.empty([full, self.seq_len], np.int32)
    rows[:, 0], rows[:, -1] = self.bos, self.eos
    rows[:, 1:-1] = tokens[: full * self.chunk].reshape(full, self.chunk)
    return rows

  def finish(self) -> np.ndarray:
    """The last, partial row (bos, the rest, eos, padding), if any."""
    if not self.carry.size:
      return np.zeros([0, self.seq_len], np.int32)
    row = np.full([1, self.seq_len], self.pad, np.int32)
    row[0, 0] = self.bos
    row[0, 1 : 1 + self.carry.size] = self.carry
    row[0, 1 + self.carry.size] = self.eos
    self.carry = np.zeros([0], np.int32)
    return row


def pack_documents(
    token_lists: Sequence[Sequence[int]], seq_len: int, *, bos_id: int, eos_id: int, pad_id: int
) -> np.ndarray:
  """Packs tokenized documents into an int32 array [num_sequences, seq_len].

  Concatenating the rows without their first token, their last eos and any
  padding gives back the documents joined by eos, token for token. It is the
  packing preparation streams (`Packer`), over a list in memory.
  """
  if seq_len < 3:
    raise ConfigError(
        f'config.model.max_len={seq_len} is too short: a sequence '
        'needs bos, eos and at least one token (use >= 3).'
    )
  packer = Packer(seq_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
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
