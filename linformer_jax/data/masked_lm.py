"""RoBERTa's dynamic masking: the per-sequence transform of masked-LM pretraining.

The pretraining pipeline (`pretraining`) reads packed rows (`packing`) and
makes each example with a transform; here it is masking, redone every time a
sequence is read (dynamic masking): 15% of the text tokens are chosen as loss
positions; of those 80% become <mask>, 10% a random text token and 10% stay
unchanged. It runs as a grain `RandomMap` whose generator grain derives from
the seed and the record's position in the stream, so the same seed gives the
same batches, every epoch is masked differently, and an iterator restored from
`get_state()` continues exactly.

Every batch is a dict of numpy arrays of shape [batch, seq_len]:
  inputs        int32, tokens after masking (the model's input)
  targets       int32, the original tokens
  weights       float32, 1.0 at the loss positions, else 0.0
  padding_mask  bool, True for real tokens (bos and eos included)
"""

import math
from typing import Any, Dict

import grain
import numpy as np

from linformer_jax.data import packed_batches
from linformer_jax.data import pretraining
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

Batch = packed_batches.Batch
# RoBERTa's split of the chosen positions: replaced by <mask>, by a random
# token, or left unchanged (the rest).
MASK_TOKEN_SHARE = 0.8
RANDOM_TOKEN_SHARE = 0.1


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    mask_rate: float,
    mask_id: int,
    pad_id: int,
    is_special: np.ndarray,
    replacement_ids: np.ndarray,
) -> Batch:
  """RoBERTa masking of a sequence [seq_len] or of a batch [batch, seq_len] at
  once (vectorised: no Python loop over rows); returns the examples' dict.

  In each row the number of loss positions is randomly rounded (as fairseq):
  int(mask_rate * candidates + u), u uniform in [0, 1), so its expectation is
  exactly mask_rate * candidates, also for short rows. They are a uniform
  random subset of the row's candidates (the tokens whose `is_special` entry
  is False): the candidates with the smallest uniform keys. Random
  replacements are drawn uniformly from `replacement_ids`.
  """
  tokens = np.asarray(tokens, np.int32)
  rows = tokens.reshape(-1, tokens.shape[-1])
  candidate = ~is_special[rows]
  num_chosen = (mask_rate * candidate.sum(axis=1) + rng.random(len(rows))).astype(np.int64)
  keys = np.where(candidate, rng.random(rows.shape), 2.0)  # non-candidates sort last
  # The positions of the num_chosen smallest keys: the first num_chosen of the
  # sorted order, scattered back (a second argsort, for the ranks, cost as much
  # again as this scatter does).
  order = np.argsort(keys, axis=1)
  chosen = np.empty(rows.shape, bool)
  np.put_along_axis(chosen, order, np.arange(rows.shape[1]) < num_chosen[:, None], axis=1)
  action = rng.random(rows.shape)
  inputs = rows.copy()
  inputs[chosen & (action < MASK_TOKEN_SHARE)] = mask_id
  randomized = (
      chosen & (action >= MASK_TOKEN_SHARE) & (action < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE)
  )
  inputs[randomized] = rng.choice(replacement_ids, size=int(randomized.sum()))
  return {
      'inputs': inputs.reshape(tokens.shape),
      'targets': tokens,
      'weights': chosen.astype(np.float32).reshape(tokens.shape),
      'padding_mask': tokens != pad_id,
  }


def max_predictions(seq_len: int, mask_rate: float) -> int:
  """The most loss positions `mask_tokens` chooses in a sequence of seq_len.

  At most seq_len - 2 tokens are candidates (bos and eos never are), and
  int(mask_rate * candidates + u) with u < 1 is at most
  ceil(mask_rate * (seq_len - 2)) <= ceil(mask_rate * seq_len), the bound used.
  """
  return min(seq_len, math.ceil(mask_rate * seq_len))


class DynamicMasking(grain.transforms.RandomMap):
  """`mask_tokens` as a grain transform, of a sequence or of a whole batch
  (`on_batches`: the training loader masks each batch at once); holds only
  ids, so it pickles cheaply."""

  on_batches = True

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer, mask_rate: float):
    self._mask_rate = _check_mask_rate(mask_rate)
    self._mask_id = tokenizer.mask_id
    self._pad_id = tokenizer.pad_id
    # A lookup table, not np.isin: this runs for every sequence read.
    self._is_special = np.zeros([tokenizer.vocab_size], bool)
    self._is_special[list(tokenizer.special_ids)] = True
    self._replacement_ids = np.flatnonzero(~self._is_special).astype(np.int32)

  def random_map(self, element: np.ndarray, rng: np.random.Generator) -> Batch:
    return mask_tokens(
        element,
        rng,
        mask_rate=self._mask_rate,
        mask_id=self._mask_id,
        pad_id=self._pad_id,
        is_special=self._is_special,
        replacement_ids=self._replacement_ids,
    )


def _check_mask_rate(mask_rate: Any) -> float:
  if not 0.0 < mask_rate < 1.0:
    raise ConfigError(
        f'config.data.mask_rate={mask_rate!r} is not allowed; use a fraction in (0, 1), e.g. 0.15.'
    )
  return float(mask_rate)


def build_datasets(
    config, workdir: str, process_index: int = 0, process_count: int = 1, train: bool = True
) -> pretraining.Datasets:
  """Tokenizer, training iterator and evaluation batches of a masked-LM run's
  config (`pretraining.build_datasets`), masking at config.data.mask_rate."""
  mask_rate = _check_mask_rate(config.data.mask_rate)
  return pretraining.build_datasets(
      config,
      workdir,
      lambda tokenizer: DynamicMasking(tokenizer, mask_rate),
      process_index=process_index,
      process_count=process_count,
      train=train,
  )


def prepare_splits(
    config, workdir: str, *, part_index: int = 0, part_count: int = 1, tokenizer_only: bool = False
) -> Dict[str, Any]:
  """`pretraining.prepare_splits` for a masked-LM config: a mask rate masking
  cannot use is refused before the long preparation, not after it."""
  _check_mask_rate(config.data.mask_rate)
  return pretraining.prepare_splits(
      config,
      workdir,
      part_index=part_index,
      part_count=part_count,
      tokenizer_only=tokenizer_only,
  )
