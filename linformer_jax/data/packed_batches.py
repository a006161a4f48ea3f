"""Packed rows to batches: the shuffled training iterator and the evaluation batches.

The rows are a split's packed sequences ([num_sequences, seq_len] token ids, or
a source of such rows: `packing.as_source`); what makes a training example of
a row is a *transform* (`masked_lm` masks, `causal_lm` sets next-token
targets). The training iterator shuffles the rows, shards them over processes
and can be restored from its state; evaluation batches are deterministic, and
padded with rows of weight 0 so that every process has as many.
`pretraining` builds both from a run's prepared splits.
"""

import math
from typing import Dict, List, Optional, Union

import grain
import numpy as np

from linformer_jax.data import loaders
from linformer_jax.data import packing
from linformer_jax.errors import ConfigError

Batch = Dict[str, np.ndarray]
# What makes one example (a Batch of [seq_len] arrays) of a packed row.
Transform = Union[grain.transforms.Map, grain.transforms.RandomMap]


def create_train_iterator(
    packed_sequences: np.ndarray, settings: loaders.LoaderSettings, transform: Transform
) -> loaders.BatchIterator:
  """An endless iterator of training batches for this process.

  The records are split into process_count equal shards (the remainder is
  dropped) and this process reads shard process_index, reshuffled every epoch.

  Args:
    packed_sequences: [num_sequences, seq_len] from `packing.pack_documents`, or a
      source of such rows (`packing.as_source`).
    settings: this process's batch size, shard, seed (also that of a random
      transform) and grain's parallelism.
    transform: makes each example from a row (`masked_lm.DynamicMasking`,
      `causal_lm.NextTokenTargets`).

  Returns:
    A `loaders.BatchIterator`; `get_state()` returns bytes and
    `set_state(state)` continues from them (same data, seed, batch size and
    shards; any worker_count).
  """
  source = packing.as_source(packed_sequences)
  if len(source) < settings.process_count:
    raise ConfigError(
        f'The training split has {len(source)} sequences, fewer than '
        f'the {settings.process_count} processes; use more data (config.data).'
    )
  return loaders.shuffled_batches(
      source,
      settings,
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
  batch_size = loaders.check_int('config.eval_batch_size (per process)', batch_size, 1)
  seed = loaders.check_int('seed', seed, 0, 2**32 - 1)
  process_count = loaders.check_int('process_count', process_count, 1)
  process_index = loaders.check_int('process_index', process_index, 0, process_count - 1)
  dataset = grain.MapDataset.source(source)
  if isinstance(transform, grain.transforms.RandomMap):
    dataset = dataset.random_map(transform, seed=seed)
  else:
    dataset = dataset.map(transform)
  total = len(dataset)
  if max_batches:
    max_batches = loaders.check_int('config.data.max_eval_batches', max_batches, 0)
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
