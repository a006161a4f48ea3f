"""Token ids of classification examples: one text or a pair, cut to fit and padded.

One text becomes `[bos] text [eos]`; a pair `[bos] first SEP second [eos]`,
SEP being the tokenizer's `pair_separator` (RoBERTa's `[eos] [eos]`, BERT's
`[eos]`), with segment 0 up to the first eos and 1 after it.
Texts longer than the sequence are cut to fit: truncation='head' keeps their
beginning, 'head_tail' their first and last halves (the longer text of a pair
loses tokens first).
"""

from typing import List, NamedTuple, Sequence, Tuple

import numpy as np

from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError


def _truncate(ids: List[int], budget: int, truncation: str) -> List[int]:
  if len(ids) <= budget:
    return ids
  if truncation == 'head':
    return ids[:budget]
  head = (budget + 1) // 2
  return ids[:head] + ids[len(ids) - (budget - head) :]


def _fit_pair(
    first: List[int], second: List[int], budget: int, truncation: str
) -> Tuple[List[int], List[int]]:
  """Cuts the longer text first until both fit in `budget` tokens."""
  first_len, second_len = len(first), len(second)
  while first_len + second_len > budget:
    if first_len >= second_len:
      first_len -= 1
    else:
      second_len -= 1
  return (_truncate(first, first_len, truncation), _truncate(second, second_len, truncation))


def encode_texts(
    texts: Sequence[str], tokenizer: tokenizer_lib.Tokenizer, seq_len: int, truncation: str = 'head'
) -> Tuple[List[int], List[int]]:
  """(token ids, segment ids) of one example of 1 or 2 texts, not padded."""
  bos, eos = tokenizer.bos_id, tokenizer.eos_id
  if len(texts) == 1:
    ids = _truncate(tokenizer.encode(texts[0]), seq_len - 2, truncation)
    return [bos] + ids + [eos], [0] * (len(ids) + 2)
  if len(texts) != 2:
    raise ConfigError(
        f'config.data.text_columns names {len(texts)} columns; use 1 '
        '(single texts) or 2 (pairs).'
    )
  separator = list(tokenizer.pair_separator)
  first, second = _fit_pair(
      tokenizer.encode(texts[0]),
      tokenizer.encode(texts[1]),
      seq_len - 2 - len(separator),
      truncation,
  )
  ids = [bos] + first + separator + second + [eos]
  return ids, [0] * (len(first) + 2) + [1] * (len(second) + len(separator))


def _pad_rows(rows: Sequence[List[int]], seq_len: int, pad_id: int) -> np.ndarray:
  out = np.full([len(rows), seq_len], pad_id, np.int32)
  for i, row in enumerate(rows):
    out[i, : len(row)] = row
  return out


class EncodedSplit(NamedTuple):
  """A split's examples as padded arrays."""

  inputs: np.ndarray  # int32 [num, n]
  segments: np.ndarray  # int32 [num, n]
  labels: np.ndarray  # int32 [num]
  pad_id: int


def encode_examples(
    examples, tokenizer: tokenizer_lib.Tokenizer, seq_len: int, truncation: str
) -> EncodedSplit:
  """Every example of `examples` ([texts], labels) as rows of seq_len tokens."""
  encoded = [encode_texts(t, tokenizer, seq_len, truncation) for t in examples.texts]
  return EncodedSplit(
      _pad_rows([ids for ids, _ in encoded], seq_len, tokenizer.pad_id),
      _pad_rows([seg for _, seg in encoded], seq_len, 0),
      examples.labels,
      tokenizer.pad_id,
  )
