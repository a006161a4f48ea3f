"""The grain loader every task's training data goes through, and the per-process
batch sizes.

Each process reads its own shard of the records, reshuffled every epoch, for
ever; the iterator's `get_state()` bytes resume it exactly (same records,
seed, batch size, shards and worker count).
"""

from typing import Any, Sequence, Tuple

import grain

from linformer_jax.errors import ConfigError


def per_process_batch_sizes(config, process_count: int) -> Tuple[int, int]:
  """(batch_size, eval_batch_size) of one process; the global sizes must divide."""
  for field in ('batch_size', 'eval_batch_size'):
    if config[field] % process_count:
      raise ConfigError(
          f'config.{field}={config[field]} is not divisible by the '
          f'{process_count} processes; change it to a multiple.'
      )
  return config.batch_size // process_count, config.eval_batch_size // process_count


def shuffled_batches(
    source: grain.sources.RandomAccessDataSource,
    *,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    worker_count: int = 0,
    transforms: Sequence[Any] = (),
    batch_transforms: Sequence[Any] = (),
    read_threads: int = 0,
    prefetch_buffer: int = 0,
) -> grain.DataLoaderIterator:
  """Endless batches of `source`, this process's shard, shuffled every epoch.

  Args:
    source: the records, all processes' (the remainder of an uneven split is
      dropped).
    batch_size: records per batch on this process.
    seed: the shuffling seed (random transforms derive theirs from it too).
    process_index, process_count: this process's shard and the shard count.
    worker_count: grain worker processes (0 = in this process; >0 needs a
      `__main__` guard and parsed absl flags in the program).
    transforms: grain transforms (Map, RandomMap) applied to each record
      before batching.
    batch_transforms: grain transforms applied to each batch (numpy arrays
      [batch_size, ...]), after batching.
    read_threads, prefetch_buffer: grain's reader threads and the records
      they read ahead (config.data.read_threads, config.data.prefetch_buffer).
      Reading a row of an in-memory array or a memory-mapped shard needs no
      threads: on 2 cores grain's default of 16 made batches 2-3x slower (GIL
      contention), hence 0 and 0; a source that waits on storage wants them.
  """
  for field, value in (('read_threads', read_threads), ('prefetch_buffer', prefetch_buffer)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ConfigError(f'config.data.{field}={value!r} is not allowed: use an integer >= 0.')
  shard = grain.sharding.ShardOptions(
      shard_index=process_index, shard_count=process_count, drop_remainder=True
  )
  sampler = grain.samplers.IndexSampler(
      num_records=len(source), shard_options=shard, shuffle=True, num_epochs=None, seed=seed
  )
  loader = grain.DataLoader(
      data_source=source,
      sampler=sampler,
      shard_options=shard,
      operations=[
          *transforms,
          grain.transforms.Batch(batch_size, drop_remainder=True),
          *batch_transforms,
      ],
      worker_count=worker_count,
      read_options=grain.ReadOptions(
          num_threads=read_threads, prefetch_buffer_size=prefetch_buffer
      ),
  )
  return iter(loader)
