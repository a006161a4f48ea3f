"""The grain loader every task's training data goes through, and the per-process
batch sizes.

Each process reads its own shard of the records, reshuffled every epoch, for
ever; the iterator's `get_state()` bytes resume it exactly (same records,
seed, batch size and shards, any worker count).

grain handles a whole batch as one element: `ShuffledBatches` makes batch b of
the record stream at once (its record keys, one batched read, the transforms,
one stack). The batches are, bit for bit, those of grain's record-by-record
pipeline (an `IndexSampler` over the records, the per-record transforms,
`Batch`, the batch transforms) with worker_count=0; that pipeline spent about
55 us of Python per record in its sampler, prefetch and statistics, half of a
512-token record's cost (docs/data.md, "Loader throughput"). A worker process
makes whole batches (worker w of W makes batches w, w + W, ...), so the
batches are the same for every worker_count.
"""

import dataclasses
import json
import os
import sys
from typing import Any, Dict, List, Sequence, Tuple

import grain
import numpy as np

from linformer_jax.data import worker_lifetime
from linformer_jax.data.data_config import DataConfig
from linformer_jax.errors import ConfigError

_SEED_MODULUS = 2**32
# grain's IndexSampler shuffles with this many rounds of its index_shuffle.
_SHUFFLE_ROUNDS = 4
# The version of grain's DataLoader states (grain 0.2).
_STATE_VERSION = 2


def check_int(field: str, value: Any, minimum: int, maximum: int = sys.maxsize) -> int:
  """`value` as an int when it is one (not a bool) in [minimum, maximum], else a
  ConfigError naming `field`."""
  if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or not (minimum <= value <= maximum)
  ):
    raise ConfigError(f'{field}={value!r} is not allowed; use an int in [{minimum}, {maximum}].')
  return int(value)


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
  """How this process reads its endless training batches, checked once.

  Attributes:
    batch_size: records per batch on this process.
    seed: the shuffling seed (random transforms derive theirs from it too),
      an int in [0, 2**32 - 1].
    process_index, process_count: this process's shard and the shard count.
    worker_count: grain worker processes, each making whole batches (0 = in
      this process; >0 needs a `__main__` guard and parsed absl flags in the
      program).
    read_threads, prefetch_buffer: grain's threads that make batches in the
      background and the batches they make ahead; both > 0 to take effect.
  """

  batch_size: int
  seed: int
  process_index: int = 0
  process_count: int = 1
  worker_count: int = 0
  read_threads: int = 0
  prefetch_buffer: int = 0

  def __post_init__(self):
    check_int('config.batch_size (per process)', self.batch_size, 1)
    check_int('config.seed', self.seed, 0, _SEED_MODULUS - 1)
    check_int('process_count', self.process_count, 1)
    check_int('process_index', self.process_index, 0, self.process_count - 1)
    check_int('config.data.worker_count', self.worker_count, 0)
    for field in ('read_threads', 'prefetch_buffer'):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f'config.data.{field}={value!r} is not allowed: use an integer >= 0.')

  @classmethod
  def of_process(
      cls,
      data: DataConfig,
      *,
      batch_size: int,
      seed: int,
      process_index: int,
      process_count: int,
  ) -> 'LoaderSettings':
    """This process's settings, grain's parallelism from config.data
    (worker_count, read_threads, prefetch_buffer)."""
    return cls(
        batch_size=batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        worker_count=data.worker_count,
        read_threads=data.read_threads,
        prefetch_buffer=data.prefetch_buffer,
    )


def per_process_batch_sizes(loop: Any, process_count: int) -> Tuple[int, int]:
  """(batch_size, eval_batch_size) of one process, from the run's loop settings
  (`run_config.LoopSettings`); the global sizes must divide."""
  for field in ('batch_size', 'eval_batch_size'):
    if getattr(loop, field) % process_count:
      raise ConfigError(
          f'config.{field}={getattr(loop, field)} is not divisible by the '
          f'{process_count} processes; change it to a multiple.'
      )
  return loop.batch_size // process_count, loop.eval_batch_size // process_count


def _apply(transform: Any, element: Any, rng_index: int, seed: int) -> Any:
  """A grain Map or RandomMap of one element; a RandomMap gets the generator
  grain's IndexSampler gives the record at `rng_index` of the stream."""
  if isinstance(transform, grain.transforms.RandomMap):
    return transform.random_map(
        element, np.random.Generator(np.random.Philox(key=seed + rng_index))
    )
  return transform.map(element)


def _stack(records: List[Any]) -> Any:
  """grain's batching of records: arrays, or dicts of arrays, stacked."""
  if isinstance(records[0], dict):
    return {key: np.stack([record[key] for record in records]) for key in records[0]}
  return np.stack(records)


class ShuffledBatches(grain.sources.RandomAccessDataSource):
  """Element b: this process's batch b of its endless shuffled record stream.

  The stream is grain's `IndexSampler(shuffle=True, num_epochs=None, seed)`
  over `source`, sharded over the processes with the remainder dropped: this
  process's j-th record is the sampler's index j * process_count +
  process_index, the key its shard's record j mod L (L records a shard) in
  the permutation of epoch j // L. A `RandomMap` gets the generator the
  sampler gives that index: per record, or, for a batch transform, that of
  the batch's last record, as grain's `Batch` passes it on. The length is
  endless for any run: sys.maxsize over the records a batch spans.

  A grain worker unpickles its copy before making a batch; grain's
  DataLoader takes no worker initializer, so unpickling is where the worker
  arranges to end with the process that made the loader
  (`worker_lifetime`).
  """

  def __init__(
      self,
      source: grain.sources.RandomAccessDataSource,
      *,
      batch_size: int,
      seed: int,
      process_index: int,
      process_count: int,
      transforms: Sequence[Any],
      batch_transforms: Sequence[Any],
  ):
    for transform in (*transforms, *batch_transforms):
      if not isinstance(transform, (grain.transforms.Map, grain.transforms.RandomMap)):
        raise TypeError(f'{transform!r} is neither a grain Map nor a RandomMap.')
    self._source = source
    self._batch_size = batch_size
    self._seed = seed
    self._process_index = process_index
    self._process_count = process_count
    self._transforms = tuple(transforms)
    self._batch_transforms = tuple(batch_transforms)
    # grain's even split with drop_remainder: each shard gets len // count.
    self._shard_length = len(source) // process_count
    self._shard_start = process_index * self._shard_length
    self._read_many = getattr(source, '__getitems__', None)
    self._length = sys.maxsize // (batch_size * process_count)
    self._loader_pid = os.getpid()

  def __setstate__(self, state: Dict[str, Any]) -> None:
    self.__dict__.update(state)
    worker_lifetime.end_with_parent(self._loader_pid)

  def __len__(self) -> int:
    return self._length

  def record_keys(self, first: int, count: int) -> List[int]:
    """The source keys of this process's records first .. first + count - 1."""
    length = self._shard_length
    return [
        self._shard_start
        + grain.experimental.index_shuffle(
            local % length,
            max_index=length - 1,
            seed=(self._seed + local // length) % _SEED_MODULUS,
            rounds=_SHUFFLE_ROUNDS,
        )
        for local in range(first, first + count)
    ]

  def _stream_index(self, local: int) -> int:
    """The sampler's index of this process's local-th record."""
    return local * self._process_count + self._process_index

  def __getitem__(self, batch_index: int) -> Any:
    first = int(batch_index) * self._batch_size
    keys = self.record_keys(first, self._batch_size)
    records = self._read_many(keys) if self._read_many else [self._source[key] for key in keys]
    for transform in self._transforms:
      records = [
          _apply(transform, record, self._stream_index(first + offset), self._seed)
          for offset, record in enumerate(records)
      ]
    batch = _stack(records)
    last = self._stream_index(first + self._batch_size - 1)
    for transform in self._batch_transforms:
      batch = _apply(transform, batch, last, self._seed)
    return batch

  def __repr__(self) -> str:
    transforms = [type(t).__name__ for t in (*self._transforms, *self._batch_transforms)]
    return (
        f'ShuffledBatches(source={self._source!r}, batch_size={self._batch_size}, '
        f'seed={self._seed}, shard={self._process_index}/{self._process_count}, '
        f'transforms={transforms})'
    )

  def sampler(self) -> grain.samplers.IndexSampler:
    """The DataLoader's sampler: batch indices in order."""
    return grain.samplers.IndexSampler(
        num_records=len(self), shard_options=grain.sharding.NoSharding(), num_epochs=1
    )

  def consumed_batches(self, state: Dict[str, Any]) -> int:
    """How many batches a DataLoader state has consumed: a state of this
    loader, with any worker count, or one of grain's record-by-record loader
    over the same records and seed (checkpoints written before batches were
    made whole, all with worker_count=0)."""
    count, index = self._process_count, self._process_index
    legacy_sampler = grain.samplers.IndexSampler(
        num_records=len(self._source),
        shard_options=grain.sharding.ShardOptions(index, count, drop_remainder=True),
        shuffle=True,
        num_epochs=None,
        seed=self._seed,
    )
    if state.get('sampler') != repr(legacy_sampler):
      if state.get('data_source') != repr(self):
        raise ConfigError(
            f'The checkpoint reads its data as {state.get("data_source")}, this run as '
            f'{self!r}; resume it with the same data, config.batch_size and config.seed.'
        )
      # Workers take batches in turn, so the last one consumed is the largest.
      return max(state['last_seen_indices'].values()) + 1
    if state['worker_count'] or state['data_source'] != repr(self._source):
      raise ConfigError(
          'The checkpoint holds the data position of a record-by-record loader with '
          f'worker_count={state["worker_count"]} or other data; resume it with the code '
          'version that wrote it, or start a new run with init_from.'
      )
    records = (state['last_seen_indices']['0'] + count - index) // count
    if records % self._batch_size:
      raise ConfigError(
          f'The checkpoint stopped after {records} records, not a whole number of '
          f'batches of {self._batch_size}; resume it with its own config.batch_size.'
      )
    return records // self._batch_size

  def state_after(self, consumed: int, worker_count: int) -> Dict[str, Any]:
    """The DataLoader state of having consumed `consumed` batches with
    `worker_count` workers: worker w makes batches w, w + W, ..., and grain
    keeps the last one each has given (w - W for none)."""
    workers = max(worker_count, 1)
    last_seen = {
        str(worker): consumed - 1 - (consumed - 1 - worker) % workers
        if consumed > worker
        else worker - workers
        for worker in range(workers)
    }
    return {
        'version': _STATE_VERSION,
        'last_seen_indices': last_seen,
        'last_worker_index': (consumed - 1) % workers if worker_count else -1,
        'worker_count': worker_count,
        'sampler': repr(self.sampler()),
        'data_source': repr(self),
    }


class BatchIterator:
  """grain's iterator over `ShuffledBatches`: next batch, get_state and
  set_state as bytes. set_state takes a state written with any worker count
  (the batches do not depend on it), or a record-by-record loader's state of
  the same data (`ShuffledBatches.consumed_batches`)."""

  def __init__(self, loader: grain.DataLoader, batches: ShuffledBatches, worker_count: int):
    self._batches = batches
    self._worker_count = worker_count
    self._iterator = iter(loader)

  def __iter__(self) -> 'BatchIterator':
    return self

  def __next__(self) -> Any:
    return next(self._iterator)

  def get_state(self) -> bytes:
    return self._iterator.get_state()

  def set_state(self, state: bytes) -> None:
    consumed = self._batches.consumed_batches(json.loads(state))
    resumable = self._batches.state_after(consumed, self._worker_count)
    self._iterator.set_state(json.dumps(resumable).encode())


def shuffled_batches(
    source: grain.sources.RandomAccessDataSource,
    settings: LoaderSettings,
    *,
    transforms: Sequence[Any] = (),
    batch_transforms: Sequence[Any] = (),
) -> BatchIterator:
  """Endless batches of `source`, this process's shard, shuffled every epoch.

  Args:
    source: the records, all processes' (the remainder of an uneven split is
      dropped); a `__getitems__` reads a batch's records in one call.
    settings: this process's batch size, shard, seed and grain's parallelism.
    transforms: grain Map or RandomMap transforms applied to each record
      before batching.
    batch_transforms: the same, applied to each batch (numpy arrays
      [batch_size, ...]).
  """
  batches = ShuffledBatches(
      source,
      batch_size=settings.batch_size,
      seed=settings.seed,
      process_index=settings.process_index,
      process_count=settings.process_count,
      transforms=transforms,
      batch_transforms=batch_transforms,
  )
  loader = grain.DataLoader(
      data_source=batches,
      sampler=batches.sampler(),
      shard_options=grain.sharding.NoSharding(),
      worker_count=settings.worker_count,
      read_options=grain.ReadOptions(
          num_threads=settings.read_threads, prefetch_buffer_size=settings.prefetch_buffer
      ),
  )
  return BatchIterator(loader, batches, settings.worker_count)
