"""Masked-LM input pipeline: RoBERTa dynamic masking, grain loaders, datasets.

Sequences are packed by `packing` (FULL-SENTENCES: `[bos] chunk [eos]` rows of
seq_len tokens). The loaders and `build_datasets` take the per-sequence
transform as an argument (`causal_lm` passes its own); the default is masking.

Masking is redone every time a sequence is read (dynamic masking): 15% of the
text tokens are chosen as loss positions; of those 80% become <mask>, 10% a
random text token and 10% stay unchanged. It runs as a grain `RandomMap`
whose generator grain derives from the seed and the record's position in the
stream, so the same seed gives the same batches, every epoch is masked
differently, and an iterator restored from `get_state()` continues exactly.

Every batch is a dict of numpy arrays of shape [batch, seq_len]:
  inputs        int32, tokens after masking (the model's input)
  targets       int32, the original tokens
  weights       float32, 1.0 at the loss positions, else 0.0
  padding_mask  bool, True for real tokens (bos and eos included)
"""

import contextlib
import math
import pathlib
import sys
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Union

import grain
import numpy as np

from linformer_jax.data import corpus
from linformer_jax.data import loaders
from linformer_jax.data import packing
from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import units
from linformer_jax.errors import ConfigError

Batch = Dict[str, np.ndarray]
# Packing lives in `packing`; tests and `prepare`'s docs still name it here.
pack_documents = packing.pack_documents
# What makes one example (a Batch of [seq_len] arrays) of a packed row.
Transform = Union[grain.transforms.Map, grain.transforms.RandomMap]
# RoBERTa's split of the chosen positions: replaced by <mask>, by a random
# token, or left unchanged (the rest).
MASK_TOKEN_SHARE = 0.8
RANDOM_TOKEN_SHARE = 0.1
# Evaluation masks with this seed whatever config.seed is, so that runs with
# different seeds are scored on the same masked positions.
EVAL_MASKING_SEED = 0


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
  """RoBERTa masking of one sequence; returns one example of a batch dict.

  `is_special` is a bool per vocabulary id (True: never chosen); random
  replacements are drawn uniformly from `replacement_ids`.
  """
  tokens = np.asarray(tokens, np.int32)
  candidates = np.flatnonzero(~is_special[tokens])
  # Randomized rounding (as fairseq): the expected count is exactly
  # mask_rate * candidates, also for short sequences.
  num_chosen = int(mask_rate * candidates.size + rng.random())
  chosen = rng.choice(candidates, size=num_chosen, replace=False)
  action = rng.random(num_chosen)
  inputs = tokens.copy()
  inputs[chosen[action < MASK_TOKEN_SHARE]] = mask_id
  randomized = chosen[
      (action >= MASK_TOKEN_SHARE) & (action < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE)
  ]
  inputs[randomized] = rng.choice(replacement_ids, size=randomized.size)
  weights = np.zeros(tokens.shape, np.float32)
  weights[chosen] = 1.0
  return {'inputs': inputs, 'targets': tokens, 'weights': weights, 'padding_mask': tokens != pad_id}


def max_predictions(seq_len: int, mask_rate: float) -> int:
  """The most loss positions `mask_tokens` chooses in a sequence of seq_len.

  At most seq_len - 2 tokens are candidates (bos and eos never are), and
  int(mask_rate * candidates + u) with u < 1 is at most
  ceil(mask_rate * (seq_len - 2)) <= ceil(mask_rate * seq_len), the bound used.
  """
  return min(seq_len, math.ceil(mask_rate * seq_len))


class DynamicMasking(grain.transforms.RandomMap):
  """`mask_tokens` as a grain transform; holds only ids, so it pickles cheaply."""

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


def _check_int(field: str, value: Any, minimum: int, maximum: int = sys.maxsize) -> int:
  if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or not (minimum <= value <= maximum)
  ):
    raise ConfigError(f'{field}={value!r} is not allowed; use an int in [{minimum}, {maximum}].')
  return int(value)


def create_train_iterator(
    packed_sequences: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    mask_rate: Optional[float] = None,
    tokenizer: tokenizer_lib.Tokenizer,
    process_index: int = 0,
    process_count: int = 1,
    worker_count: int = 0,
    transform: Optional[Transform] = None,
) -> grain.DataLoaderIterator:
  """An endless iterator of training batches for this process.

  The records are split into process_count equal shards (the remainder is
  dropped) and this process reads shard process_index, reshuffled every epoch.

  Args:
    packed_sequences: [num_sequences, seq_len] from `pack_documents`, or a
      source of such rows (`packing.as_source`).
    batch_size: examples per batch on this process.
    seed: shuffling and masking seed, an int in [0, 2**32 - 1].
    mask_rate: fraction of text tokens chosen as loss positions (read only
      without `transform`).
    tokenizer: gives the special ids and the vocabulary size.
    process_index, process_count: this process's shard and the shard count.
    worker_count: grain worker processes (0 = in this process; >0 needs a
      `__main__` guard and parsed absl flags in the program).
    transform: makes each example from a row; None: masking,
      `DynamicMasking(tokenizer, mask_rate)`.

  Returns:
    A `grain.DataLoaderIterator`; `get_state()` returns bytes and
    `set_state(state)` continues from them (same data, seed, batch size,
    shards and worker_count).
  """
  source = packing.as_source(packed_sequences)
  batch_size = _check_int('config.batch_size (per process)', batch_size, 1)
  seed = _check_int('config.seed', seed, 0, 2**32 - 1)
  process_count = _check_int('process_count', process_count, 1)
  process_index = _check_int('process_index', process_index, 0, process_count - 1)
  worker_count = _check_int('config.data.worker_count', worker_count, 0)
  if len(source) < process_count:
    raise ConfigError(
        f'The training split has {len(source)} sequences, fewer than '
        f'the {process_count} processes; use more data (config.data).'
    )
  return loaders.shuffled_batches(
      source,
      batch_size=batch_size,
      seed=seed,
      process_index=process_index,
      process_count=process_count,
      worker_count=worker_count,
      transforms=[DynamicMasking(tokenizer, mask_rate) if transform is None else transform],
  )


def _empty_rows(count: int, seq_len: int, pad_id: int) -> Batch:
  """Rows that change no metric: all padding, no loss positions."""
  return {
      'inputs': np.full([count, seq_len], pad_id, np.int32),
      'targets': np.full([count, seq_len], pad_id, np.int32),
      'weights': np.zeros([count, seq_len], np.float32),
      'padding_mask': np.zeros([count, seq_len], bool),
  }


def create_eval_batches(
    packed_sequences: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    mask_rate: Optional[float] = None,
    tokenizer: tokenizer_lib.Tokenizer,
    max_batches: Optional[int] = None,
    process_index: int = 0,
    process_count: int = 1,
    transform: Optional[Transform] = None,
) -> List[Batch]:
  """Deterministic evaluation batches of this process, none dropped.

  Sequences are taken in order (the first max_batches * batch_size *
  process_count if max_batches is set) and dealt round-robin to the processes.
  Every process gets the same number of batches; the missing rows are
  `_empty_rows` with zero weight. Each example is made from its row by
  `transform` (None: `DynamicMasking(tokenizer, mask_rate)`); a random one
  (masking) draws from `seed` and the row's position in the split, so a
  sequence is masked the same way whatever the batch size or process count.
  """
  source = packing.as_source(packed_sequences)
  batch_size = _check_int('config.eval_batch_size (per process)', batch_size, 1)
  seed = _check_int('seed', seed, 0, 2**32 - 1)
  process_count = _check_int('process_count', process_count, 1)
  process_index = _check_int('process_index', process_index, 0, process_count - 1)
  if transform is None:
    transform = DynamicMasking(tokenizer, mask_rate)
  dataset = grain.MapDataset.source(source)
  if isinstance(transform, grain.transforms.RandomMap):
    dataset = dataset.random_map(transform, seed=seed)
  else:
    dataset = dataset.map(transform)
  total = len(dataset)
  if max_batches:
    max_batches = _check_int('config.data.max_eval_batches', max_batches, 0)
    total = min(total, max_batches * batch_size * process_count)
  num_batches = math.ceil(math.ceil(total / process_count) / batch_size)
  # Slicing after random_map keeps each sequence's generator tied to its
  # position in the whole split, not in this process's share.
  local = dataset[:total][process_index::process_count]
  batches = list(local.batch(batch_size))
  seq_len = source[0].shape[0]
  while len(batches) < num_batches:
    batches.append(_empty_rows(batch_size, seq_len, tokenizer.pad_id))
  missing = batch_size - batches[-1]['inputs'].shape[0]
  if missing:
    padding = _empty_rows(missing, seq_len, tokenizer.pad_id)
    batches[-1] = {key: np.concatenate([value, padding[key]]) for key, value in batches[-1].items()}
  return batches


class Datasets(NamedTuple):
  """What `build_datasets` returns; token counts are over all processes."""

  tokenizer: tokenizer_lib.Tokenizer
  train_iterator: Optional[grain.DataLoaderIterator]  # None for evaluation only
  eval_batches: List[Batch]
  train_tokens: int  # non-padding tokens (bos/eos included) of the train split
  eval_tokens: int  # same for the evaluation split, all of it
  train_sequences: int
  eval_sequences: int
  train_token_counts: np.ndarray  # [vocab_size] occurrences of each id in the train split

  @property
  def tokenizer_sha256(self) -> Optional[str]:
    """sha256 of WORKDIR/tokenizer.model, None for bytes: checkpoints keep it."""
    return self.tokenizer.sha256


@contextlib.contextmanager
def _run_tokenizer(
    config, workdir: str, *, check_mask_rate: bool = True
) -> Iterator[tokenizer_lib.Tokenizer]:
  """Checks the data fields and that the eval split exists, then yields the
  run's tokenizer (trained on a bounded sample of the training split the first
  time, and kept in the workdir only if the block succeeds)."""
  data = config.data
  for field in ('train_split', 'eval_split'):
    if not isinstance(data[field], str) or not data[field]:
      raise ConfigError(
          f'config.data.{field}={data[field]!r} is not allowed; name a '
          "split, e.g. 'train' or 'validation'."
      )
  if data.source not in corpus.SOURCES:
    raise ConfigError(
        f'config.data.source={data.source!r} is not allowed; use one of {corpus.SOURCES}.'
    )
  sample = _check_int(
      'config.data.tokenizer_sample_chars',
      data.get('tokenizer_sample_chars', prepare.TOKENIZER_SAMPLE_CHARS),
      1,
  )
  if check_mask_rate:
    _check_mask_rate(data.mask_rate)
  tokens = tokenizer_lib.vocab_size_of(data)  # known before a tokenizer is trained
  model_vocab = config.model.get('vocab_size')
  if model_vocab is not None and model_vocab != tokens:
    raise ConfigError(
        f"config.model.vocab_size={model_vocab} does not match the tokenizer's "
        f'{tokens} tokens; set config.data.vocab_size={tokens} '
        '(config.model.vocab_size follows it).'
    )
  # Fails on a missing eval split now, not after the tokenizer and the
  # training split are done (the training split is read to train first).
  if next(units.split_units(data, data.eval_split), None) is None:
    raise ConfigError(
        f'Split {data.eval_split!r} holds no documents; check config.data.eval_split '
        'and config.data.source.'
    )
  with tokenizer_lib.workdir_tokenizer(
      data,
      workdir,
      lambda: units.sample_documents(data, data.train_split, sample),
      pretrained_model=_pretrained_tokenizer(config),
  ) as tokenizer:
    yield tokenizer


def _pretrained_tokenizer(config) -> Optional[str]:
  """The tokenizer file of run config.init_from, if it has one of the
  configured kind: a run that starts from another's parameters reads text
  with the same token ids."""
  filename = tokenizer_lib.FILENAMES.get(config.data.tokenizer)
  if not filename or not config.get('init_from'):
    return None
  path = pathlib.Path(config.init_from) / filename
  return str(path) if path.exists() else None


def prepare_splits(
    config, workdir: str, *, part_index: int = 0, part_count: int = 1, tokenizer_only: bool = False
) -> Dict[str, Any]:
  """Prepares part `part_index` of `part_count` of the train and eval splits.

  Returns a summary: per split its folder, this part's sequences, tokens and
  shards, and whether every part is there yet. A tokenizer trained here is
  kept in `workdir` once the splits are prepared (at once with
  `tokenizer_only`).
  """
  part_count = _check_int('--part_count', part_count, 1)
  part_index = _check_int('--part_index', part_index, 0, part_count - 1)
  seq_len = _check_int('config.model.max_len', config.model.max_len, 3)
  with _run_tokenizer(config, workdir) as tokenizer:
    summary: Dict[str, Any] = {'tokenizer': tokenizer.fingerprint}
    if not tokenizer_only:
      summary.update(_prepare_parts(config, tokenizer, seq_len, part_index, part_count))
    return summary


def _prepare_parts(
    config, tokenizer: tokenizer_lib.Tokenizer, seq_len: int, part_index: int, part_count: int
) -> Dict[str, Any]:
  """`prepare_splits`'s summary of each split."""
  summary = {}
  for split in dict.fromkeys((config.data.train_split, config.data.eval_split)):
    signature = prepare.split_signature(config.data, split, tokenizer, seq_len)
    folder = prepare.split_folder(config.data, split, signature)
    with prepare.preparing(folder, part_index, part_count):
      manifest = prepare.prepare_part(
          config.data,
          split,
          folder,
          tokenizer=tokenizer,
          seq_len=seq_len,
          signature=signature,
          workers=prepare.workers_of(config.data),
          sequences_per_shard=prepare.sequences_per_shard_of(config.data),
          part_index=part_index,
          part_count=part_count,
      )
    try:
      shards.PreparedSplit(folder, signature)
      all_parts = True
    except ConfigError:
      all_parts = False
    summary[split] = {
        'folder': str(folder),
        'sequences': manifest['sequences'],
        'tokens': manifest['tokens'],
        'shards': len(manifest['shards']),
        'all_parts_prepared': all_parts,
    }
  return summary


def build_datasets(
    config,
    workdir: str,
    process_index: int = 0,
    process_count: int = 1,
    train: bool = True,
    make_transform: Optional[Callable[[tokenizer_lib.Tokenizer], Transform]] = None,
) -> Datasets:
  """Tokenizer, training iterator and evaluation batches of a run's config.

  Reads config.seed, batch_size, eval_batch_size (global; divided among the
  processes), model.max_len and config.data.*. The tokenizer lives in
  `workdir`; the splits are prepared as ArrayRecord shards (`prepare`) under
  config.data.prepared_dir or the cache the first time, and read from them with
  random access. Without `train` (evaluation only), `train_iterator` is None.
  A tokenizer trained here is kept in `workdir` only once all of this
  succeeded, so a run refused for its data leaves none behind.
  `make_transform(tokenizer)` gives the transform that makes each example of
  a row; None: masking at config.data.mask_rate (read only then).
  """
  seq_len = _check_int('config.model.max_len', config.model.max_len, 3)
  _check_int('config.batch_size', config.batch_size, 1)
  _check_int('config.eval_batch_size', config.eval_batch_size, 1)
  with _run_tokenizer(config, workdir, check_mask_rate=make_transform is None) as tokenizer:
    if make_transform is None:
      transform = DynamicMasking(tokenizer, config.data.mask_rate)
    else:
      transform = make_transform(tokenizer)
    return _datasets(config, tokenizer, seq_len, process_index, process_count, train, transform)


def _datasets(
    config,
    tokenizer: tokenizer_lib.Tokenizer,
    seq_len: int,
    process_index: int,
    process_count: int,
    train: bool,
    transform: Transform,
) -> Datasets:
  """`build_datasets` once the tokenizer and the transform are known."""
  data = config.data
  batch_size, eval_batch_size = loaders.per_process_batch_sizes(config, process_count)
  # Process 0 prepares what is missing (the others wait for it); everyone
  # then reads only the shards' footers and manifests, whatever their size.
  train_prepared, eval_prepared = (
      prepare.prepared_split(
          data, split, tokenizer=tokenizer, seq_len=seq_len, prepare=process_index == 0
      )
      for split in (data.train_split, data.eval_split)
  )
  train_split = shards.ShardedSequences(train_prepared, seq_len)
  evaluation = shards.ShardedSequences(eval_prepared, seq_len)
  train_iterator = None
  if train:
    train_iterator = create_train_iterator(
        train_split,
        batch_size=batch_size,
        seed=config.seed,
        tokenizer=tokenizer,
        process_index=process_index,
        process_count=process_count,
        worker_count=data.worker_count,
        transform=transform,
    )
  eval_batches = create_eval_batches(
      evaluation,
      batch_size=eval_batch_size,
      seed=EVAL_MASKING_SEED,
      tokenizer=tokenizer,
      max_batches=data.max_eval_batches or None,
      process_index=process_index,
      process_count=process_count,
      transform=transform,
  )
  return Datasets(
      tokenizer=tokenizer,
      train_iterator=train_iterator,
      eval_batches=eval_batches,
      train_tokens=train_prepared.tokens,
      eval_tokens=eval_prepared.tokens,
      train_sequences=train_prepared.sequences,
      eval_sequences=eval_prepared.sequences,
      train_token_counts=train_prepared.unigram_counts,
  )
