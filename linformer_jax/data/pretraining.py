"""The pretraining input pipeline that masked and causal language modelling share.

A run's tokenizer lives in its workdir (trained on a bounded sample of the
training split the first time); the train and eval splits are prepared once as
ArrayRecord shards of packed rows (`prepare`, `packing`: `[bos] chunk [eos]`
rows of seq_len tokens) and read with random access. The training iterator
shuffles the rows, shards them over processes and can be restored from its
state; evaluation batches are deterministic. What makes a training example of a
row is the task's *transform*, an argument here: `masked_lm` masks (a whole
training batch at once: its `on_batches`), `causal_lm` sets next-token targets
row by row. A random transform (a grain `RandomMap`) draws from a generator
grain derives from the seed and the row's (or batch's) position in the
stream, so the same seed gives the same batches and a restored iterator
continues exactly.

Every batch is a dict of numpy arrays of shape [batch, seq_len] with the keys
the transform gives; the masked and causal ones give
  inputs        int32, the model's input
  targets       int32, the tokens to predict
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

from linformer_jax import storage
from linformer_jax.data import loaders
from linformer_jax.data import packing
from linformer_jax.data import prepare
from linformer_jax.data import remote_splits
from linformer_jax.data import shards
from linformer_jax.data import sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import units
from linformer_jax.errors import ConfigError

Batch = Dict[str, np.ndarray]
# What makes one example (a Batch of [seq_len] arrays) of a packed row.
Transform = Union[grain.transforms.Map, grain.transforms.RandomMap]
# Evaluation draws a random transform's choices (masking) from this seed
# whatever config.seed is, so that runs with different seeds are scored on the
# same examples.
EVAL_SEED = 0


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
    transform: Transform,
    process_index: int = 0,
    process_count: int = 1,
    worker_count: int = 0,
    read_threads: int = 0,
    prefetch_buffer: int = 0,
) -> loaders.BatchIterator:
  """An endless iterator of training batches for this process.

  The records are split into process_count equal shards (the remainder is
  dropped) and this process reads shard process_index, reshuffled every epoch.

  Args:
    packed_sequences: [num_sequences, seq_len] from `packing.pack_documents`, or a
      source of such rows (`packing.as_source`).
    batch_size: examples per batch on this process.
    seed: the seed of the shuffling and of a random transform, an int in
      [0, 2**32 - 1].
    transform: makes each example from a row (`masked_lm.DynamicMasking`,
      `causal_lm.NextTokenTargets`).
    process_index, process_count: this process's shard and the shard count.
    worker_count, read_threads, prefetch_buffer: see `loaders.shuffled_batches`.

  Returns:
    A `loaders.BatchIterator`; `get_state()` returns bytes and
    `set_state(state)` continues from them (same data, seed, batch size and
    shards; any worker_count).
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
      read_threads=read_threads,
      prefetch_buffer=prefetch_buffer,
      # A transform that takes whole batches (masking) runs once per batch.
      **(
          {'batch_transforms': [transform]}
          if getattr(transform, 'on_batches', False)
          else {'transforms': [transform]}
      ),
  )


def _filler_rows(transform: Transform, count: int, seq_len: int, pad_id: int) -> Batch:
  """Rows that change no metric: the transform's example of an all-padding row,
  its weights zero."""
  row = np.full([seq_len], pad_id, np.int32)
  if isinstance(transform, grain.transforms.RandomMap):
    example = transform.random_map(row, np.random.default_rng(0))
  else:
    example = transform.map(row)
  example['weights'] = np.zeros_like(example['weights'])
  return {key: np.stack([value] * count) for key, value in example.items()}


def create_eval_batches(
    packed_sequences: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    transform: Transform,
    pad_id: int,
    max_batches: Optional[int] = None,
    process_index: int = 0,
    process_count: int = 1,
) -> List[Batch]:
  """Deterministic evaluation batches of this process, none dropped.

  Sequences are taken in order (the first max_batches * batch_size *
  process_count if max_batches is set) and dealt round-robin to the processes.
  Every process gets the same number of batches; the missing rows are
  `_filler_rows` (all `pad_id`) with zero weight. Each example is made from
  its row by `transform` (a dict holding at least 'inputs' and the loss
  'weights'); a random one (masking) draws from `seed` and the row's
  position in the split, so a sequence is masked the same way whatever the
  batch size or process count.
  """
  source = packing.as_source(packed_sequences)
  batch_size = _check_int('config.eval_batch_size (per process)', batch_size, 1)
  seed = _check_int('seed', seed, 0, 2**32 - 1)
  process_count = _check_int('process_count', process_count, 1)
  process_index = _check_int('process_index', process_index, 0, process_count - 1)
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
    batches.append(_filler_rows(transform, batch_size, seq_len, pad_id))
  missing = batch_size - batches[-1]['inputs'].shape[0]
  if missing:
    padding = _filler_rows(transform, missing, seq_len, pad_id)
    batches[-1] = {key: np.concatenate([value, padding[key]]) for key, value in batches[-1].items()}
  return batches


class Datasets(NamedTuple):
  """What `build_datasets` returns; token counts are over all processes."""

  tokenizer: tokenizer_lib.Tokenizer
  train_iterator: Optional[loaders.BatchIterator]  # None for evaluation only
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
def _run_tokenizer(config, workdir: str) -> Iterator[tokenizer_lib.Tokenizer]:
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
  sources.source_of(data)  # an unknown source fails here, listing the known ones
  sample = _check_int(
      'config.data.tokenizer_sample_chars',
      data.get('tokenizer_sample_chars', prepare.TOKENIZER_SAMPLE_CHARS),
      1,
  )
  tokens = tokenizer_lib.vocab_size_of(data)  # known before a tokenizer is trained
  model_vocab = config.model.vocab_size
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
  if not filename or not config.init_from:
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
  `tokenizer_only`). A `workdir` that is a file is refused, whatever the
  tokenizer.
  """
  part_count = _check_int('--part_count', part_count, 1)
  part_index = _check_int('--part_index', part_index, 0, part_count - 1)
  seq_len = _check_int('config.model.max_len', config.model.max_len, 3)
  storage.check_folder(workdir, writable=False)
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
    remote = remote_splits.remote_folder(config.data, split)
    if remote:
      remote_splits.download(remote, folder)
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
    if remote:
      remote_splits.upload(folder, remote)
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
    make_transform: Callable[[tokenizer_lib.Tokenizer], Transform],
    process_index: int = 0,
    process_count: int = 1,
    train: bool = True,
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
  a row.
  """
  seq_len = _check_int('config.model.max_len', config.model.max_len, 3)
  _check_int('config.batch_size', config.batch_size, 1)
  _check_int('config.eval_batch_size', config.eval_batch_size, 1)
  with _run_tokenizer(config, workdir) as tokenizer:
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
        transform=transform,
        process_index=process_index,
        process_count=process_count,
        worker_count=data.worker_count,
        read_threads=data.get('read_threads', 0),
        prefetch_buffer=data.get('prefetch_buffer', 0),
    )
  eval_batches = create_eval_batches(
      evaluation,
      batch_size=eval_batch_size,
      seed=EVAL_SEED,
      transform=transform,
      pad_id=tokenizer.pad_id,
      max_batches=data.max_eval_batches or None,
      process_index=process_index,
      process_count=process_count,
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
