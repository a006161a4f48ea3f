"""What the Python API's passes read, from texts or token ids, and fill_mask's text.

`encode` turns texts (or pairs) into the padded rows a model reads, as
`Run.encode` (linformer_jax/api.py) documents; `checked_batch` checks token
ids, a padding mask and segment ids given by hand against the model's
vocabulary and segments. fill_mask's rows hold the tokenizer's mask id in
place of `MASK_MARKER`, and its guesses come back as text
(`fill_mask_guesses`). Every check raises a ValueError that says what to pass
instead.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple
import warnings

import numpy as np
import numpy.typing as npt

from linformer_jax.data import encoding
from linformer_jax.data import tokenizer as tokenizer_lib

PADDING = ('longest', 'max_length')
# The marker of the token `Run.fill_mask` fills in, whatever the tokenizer.
MASK_MARKER = tokenizer_lib.MASK_PIECE


def text_list(texts: Any, name: str) -> List[str]:
  """`texts` as a non-empty list of strings; a single string is refused."""
  if isinstance(texts, str):
    raise ValueError(f'{name} must be a list of texts; pass [text] for one.')
  texts = list(texts)
  if not texts or not all(isinstance(text, str) for text in texts):
    raise ValueError(f'{name} must be a non-empty list of strings.')
  return texts


def is_text(inputs: Any) -> bool:
  """Whether the passes were given texts (to encode) rather than token ids."""
  return isinstance(inputs, str) or bool(
      isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)
  )


def encode(
    tokenizer: tokenizer_lib.Tokenizer,
    texts: Sequence[str],
    text_pairs: Optional[Sequence[str]],
    *,
    max_len: int,
    num_segments: int,
    padding: str,
    max_length: Optional[int],
    truncation: bool,
    return_segment_ids: bool,
) -> Tuple[np.ndarray, ...]:
  """`Run.encode` for a model of n = `max_len` and `num_segments` segments
  reading `tokenizer`'s ids; its docstring says what each argument does and
  what is returned or refused."""
  texts = text_list(texts, 'texts')
  pairs = None if text_pairs is None else text_list(text_pairs, 'text_pairs')
  if pairs is not None and len(pairs) != len(texts):
    raise ValueError(
        f'text_pairs holds {len(pairs)} texts and texts {len(texts)}; give one pair per text.'
    )
  if padding not in PADDING:
    raise ValueError(f'padding={padding!r}: use one of {", ".join(map(repr, PADDING))}.')
  if not isinstance(truncation, bool):
    raise ValueError(f'truncation={truncation!r}: use True (cut, with a warning) or False.')
  has_segments = num_segments >= 2
  if return_segment_ids and not has_segments:
    raise ValueError(
        'return_segment_ids=True: this model has no segment embedding '
        f'(model.num_segments={num_segments}); leave it out.'
    )
  if pairs is not None and has_segments and not return_segment_ids:
    raise ValueError(
        f'This model tells the texts of a pair apart by segment (model.num_segments='
        f'{num_segments}); pass return_segment_ids=True and give the '
        'segment ids to the passes.'
    )
  least = 2 + (len(tokenizer.pair_separator) if pairs is not None else 0)
  max_length = _checked_max_length(max_length, least, max_len)
  examples = [[text] for text in texts] if pairs is None else [list(p) for p in zip(texts, pairs)]
  # Each row's whole length, [bos] and [eos] included, to say what a cut drops.
  full_lengths = [len(ids) + 2 for ids in tokenizer.encode_all(texts)]
  if pairs is not None:
    separator = len(tokenizer.pair_separator)
    pair_lengths = [len(ids) + separator for ids in tokenizer.encode_all(pairs)]
    full_lengths = [a + b for a, b in zip(full_lengths, pair_lengths)]
  rows, segment_rows, dropped = [], [], {}
  for row, (example, full_length) in enumerate(zip(examples, full_lengths)):
    if full_length > max_length:
      if not truncation:
        raise ValueError(
            f'Row {row} is {full_length} tokens with [bos] and [eos], {full_length - max_length} '
            f'more than max_length={max_length}; pass truncation=True to cut it, or a '
            'shorter text.'
        )
      dropped[row] = full_length - max_length
    ids, segments = encoding.encode_texts(example, tokenizer, max_length)
    rows.append(ids)
    segment_rows.append(segments)
  if dropped:
    warnings.warn(
        f'encode cut {len(dropped)} of {len(rows)} rows to max_length={max_length}, '
        f'dropping {sum(dropped.values())} tokens (rows {sorted(dropped)}); pass '
        'truncation=False to refuse longer texts instead.',
        stacklevel=3,  # the caller of Run.encode
    )
  width = max_length if padding == 'max_length' else max(len(ids) for ids in rows)
  token_ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)
  padding_mask = np.zeros((len(rows), width), bool)
  segment_ids = np.zeros((len(rows), width), np.int32)
  for row, (ids, segments) in enumerate(zip(rows, segment_rows)):
    token_ids[row, : len(ids)] = ids
    padding_mask[row, : len(ids)] = True
    segment_ids[row, : len(segments)] = segments
  if return_segment_ids:
    return token_ids, padding_mask, segment_ids
  return token_ids, padding_mask


def _checked_max_length(max_length: Optional[int], least: int, max_len: int) -> int:
  """`max_length` checked: room for bos, eos (and a pair's separator: `least`
  in all), at most n (`max_len`, its default)."""
  if max_length is None:
    return max_len
  if isinstance(max_length, bool) or not isinstance(max_length, int):
    raise ValueError(f'max_length={max_length!r}: use an integer from {least} to {max_len}.')
  if not least <= max_length <= max_len:
    raise ValueError(
        f'max_length={max_length}: use {least} to {max_len} (config.model.max_len, the '
        'longest row the model reads).'
    )
  return max_length


def checked_batch(
    inputs: npt.ArrayLike,
    padding_mask: Optional[npt.ArrayLike],
    segment_ids: Optional[npt.ArrayLike],
    *,
    vocab_size: int,
    num_segments: int,
) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
  """int32 token ids [batch, length] in the vocabulary (0 to vocab_size - 1),
  a bool mask (None: all real) and int32 segment ids (or None; 0 to
  num_segments - 1) of their shape."""
  if isinstance(inputs, tuple) and len(inputs) in (2, 3) and np.ndim(inputs[0]) == 2:
    raise ValueError(
        "Give encode's arrays one by one: run.logits(*run.encode(texts)), not "
        'run.logits(run.encode(texts)).'
    )
  token_ids = np.asarray(inputs)
  if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
    raise ValueError(
        f'token_ids must be integers [batch, length], not {token_ids.dtype} of shape '
        f'{token_ids.shape}; add a batch axis (token_ids[None]) for one sequence.'
    )
  if token_ids.size and not 0 <= token_ids.min() <= token_ids.max() < vocab_size:
    raise ValueError(
        f'token_ids hold {token_ids.min()}..{token_ids.max()}; the vocabulary is 0 to '
        f'{vocab_size - 1}.'
    )
  if padding_mask is None:
    padding_mask = np.ones(token_ids.shape, bool)
  padding_mask = np.asarray(padding_mask)
  if padding_mask.shape != token_ids.shape:
    raise ValueError(
        f"padding_mask has shape {padding_mask.shape}; give token_ids' {token_ids.shape}."
    )
  return (
      token_ids.astype(np.int32),
      padding_mask.astype(bool),
      _checked_segments(segment_ids, token_ids.shape, num_segments),
  )


def _checked_segments(
    segment_ids: Optional[npt.ArrayLike], shape: Tuple[int, ...], num_segments: int
) -> Optional[np.ndarray]:
  if segment_ids is None:
    return None
  if num_segments < 2:
    raise ValueError(
        f'segment_ids given, but this model has no segment embedding (model.num_segments='
        f'{num_segments}): it tells a pair apart by the separator; leave them out.'
    )
  segment_ids = np.asarray(segment_ids)
  if segment_ids.shape != shape or not np.issubdtype(segment_ids.dtype, np.integer):
    raise ValueError(
        f"segment_ids must be integers of token_ids' shape {shape}, not {segment_ids.dtype} "
        f'of shape {segment_ids.shape}.'
    )
  if segment_ids.size and not 0 <= segment_ids.min() <= segment_ids.max() < num_segments:
    raise ValueError(
        f'segment_ids hold {segment_ids.min()}..{segment_ids.max()}; this model has '
        f'segments 0 to {num_segments - 1}.'
    )
  return segment_ids.astype(np.int32)


def masked_rows(
    tokenizer: tokenizer_lib.Tokenizer, texts: Sequence[str], max_len: int
) -> Tuple[np.ndarray, List[List[int]]]:
  """fill_mask's token ids: each text as `[bos] text [eos]` with the mask id in
  place of `MASK_MARKER`, padded to the longest ([len(texts), length]), and
  the rows unpadded."""
  rows = [_masked_row(tokenizer, row, text, max_len) for row, text in enumerate(texts)]
  token_ids = np.full((len(rows), max(map(len, rows))), tokenizer.pad_id, np.int32)
  for row, ids in enumerate(rows):
    token_ids[row, : len(ids)] = ids
  return token_ids, rows


def _masked_row(tokenizer: tokenizer_lib.Tokenizer, row: int, text: str, max_len: int) -> List[int]:
  """`[bos] text [eos]` with the tokenizer's mask id in place of `<mask>`."""
  if text.count(MASK_MARKER) != 1:
    raise ValueError(
        f'Text {row} holds {text.count(MASK_MARKER)} {MASK_MARKER}; fill_mask fills one '
        'per text.'
    )
  ids = tokenizer.encode(text)
  if ids.count(tokenizer.mask_id) != 1:  # a tokenizer that spells the marker out (bytes)
    before, after = text.split(MASK_MARKER)
    ids = tokenizer.encode(before) + [tokenizer.mask_id] + tokenizer.encode(after)
  ids = [tokenizer.bos_id] + list(ids) + [tokenizer.eos_id]
  if len(ids) > max_len:
    raise ValueError(
        f'Text {row} is {len(ids)} tokens with [bos] and [eos]; the model reads at most '
        f'{max_len} (config.model.max_len): shorten it around the mask.'
    )
  return ids


def fill_mask_guesses(
    tokenizer: tokenizer_lib.Tokenizer,
    rows: Sequence[List[int]],
    logits: np.ndarray,
    top_k: int,
) -> List[List[Dict[str, Any]]]:
  """Per row of `masked_rows`, the `top_k` likeliest tokens at its mask under
  `logits` [rows, length, vocab_size], as `Run.fill_mask` returns them."""
  results = []
  for row, ids in enumerate(rows):
    position = ids.index(tokenizer.mask_id)
    scores = np.exp(logits[row, position] - logits[row, position].max())
    scores /= scores.sum()
    guesses = []
    for token in np.argsort(-scores, kind='stable')[:top_k]:
      filled = ids[1:-1]  # without bos and eos
      filled[position - 1] = int(token)
      guesses.append(
          {
              'score': float(scores[token]),
              'token': int(token),
              'token_str': tokenizer.decode([int(token)]),
              'sequence': tokenizer.decode(filled),
          }
      )
    results.append(guesses)
  return results
