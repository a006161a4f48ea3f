"""The training loader makes whole batches: the same batches as grain's
record-by-record pipeline, resuming its checkpoints' positions, and the same
batches for any worker count, so a run resumes with another one."""

import pickle

from absl import flags
import grain
import numpy as np
import pytest

from linformer_jax.data import loaders
from linformer_jax.data import masked_lm
from linformer_jax.data import packing
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

MASKING = masked_lm.DynamicMasking(tokenizer_lib.ByteTokenizer(), 0.15)
# 103 rows: no process count or batch size below divides them evenly.
ROWS = np.random.default_rng(0).integers(4, 260, (103, 16)).astype(np.int32)


class NoisyExample(grain.transforms.RandomMap):
  """A per-record random transform giving a dict, as a task's might."""

  def random_map(self, element, rng):
    return {'tokens': element + rng.integers(0, 100), 'weight': np.float32(rng.random())}


def shuffled(source, *, transforms=(), batch_transforms=(), **settings):
  """`loaders.shuffled_batches` with its `LoaderSettings` given as keywords."""
  return loaders.shuffled_batches(
      source,
      loaders.LoaderSettings(**settings),
      transforms=transforms,
      batch_transforms=batch_transforms,
  )


def record_by_record(source, *, batch_size, seed, process_index=0, process_count=1, **operations):
  """grain's own pipeline, which the loader read with before batches were made
  whole: an IndexSampler over the records, per-record transforms, Batch,
  batch transforms."""
  shard = grain.sharding.ShardOptions(process_index, process_count, drop_remainder=True)
  return iter(
      grain.DataLoader(
          data_source=source,
          sampler=grain.samplers.IndexSampler(
              num_records=len(source), shard_options=shard, shuffle=True, seed=seed
          ),
          shard_options=shard,
          operations=[
              *operations.get('transforms', ()),
              grain.transforms.Batch(batch_size, drop_remainder=True),
              *operations.get('batch_transforms', ()),
          ],
      )
  )


def assert_same_batches(first, second, count):
  for _ in range(count):
    a, b = next(first), next(second)
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize(
    'batch_size, seed, process_index, process_count',
    [(8, 0, 0, 1), (5, 3, 1, 2), (7, 2**32 - 1, 2, 3)],
)
@pytest.mark.parametrize('per_record', [False, True])
def test_batches_are_those_of_the_record_by_record_pipeline(
    batch_size, seed, process_index, process_count, per_record
):
  """Over several epochs (40 batches of a shard of 34-103 rows), with the
  masking as a batch transform or a random transform of each record."""
  operations = {'transforms': [NoisyExample()]} if per_record else {'batch_transforms': [MASKING]}
  shard = dict(process_index=process_index, process_count=process_count)
  source = packing.as_source(ROWS)
  expected = record_by_record(source, batch_size=batch_size, seed=seed, **shard, **operations)
  batches = shuffled(source, batch_size=batch_size, seed=seed, **shard, **operations)
  assert_same_batches(expected, batches, 40)


def test_a_record_by_record_position_resumes_at_the_same_batch():
  """A checkpoint written before batches were made whole continues where it
  stopped, and the converted position round-trips."""
  source = packing.as_source(ROWS)
  shard = dict(process_index=1, process_count=2)
  expected = record_by_record(source, batch_size=6, seed=4, batch_transforms=[MASKING], **shard)
  for _ in range(11):
    next(expected)
  resumed = shuffled(source, batch_size=6, seed=4, batch_transforms=[MASKING], **shard)
  resumed.set_state(expected.get_state())
  assert_same_batches(expected, resumed, 3)
  again = shuffled(source, batch_size=6, seed=4, batch_transforms=[MASKING], **shard)
  again.set_state(resumed.get_state())
  assert_same_batches(expected, again, 3)


def test_a_position_of_other_batches_is_refused_naming_the_fields():
  source = packing.as_source(ROWS)
  iterator = shuffled(source, batch_size=6, seed=0, batch_transforms=[MASKING])
  next(iterator)
  other = shuffled(source, batch_size=4, seed=0, batch_transforms=[MASKING])
  with pytest.raises(ConfigError, match='config.batch_size and config.seed'):
    other.set_state(iterator.get_state())
  legacy = record_by_record(source, batch_size=4, seed=0, batch_transforms=[MASKING])
  next(legacy)
  with pytest.raises(ConfigError, match='not a whole number of batches of 6'):
    shuffled(source, batch_size=6, seed=0, batch_transforms=[MASKING]).set_state(legacy.get_state())


class ShortRows(grain.transforms.Filter):

  def filter(self, element):
    return len(element) < 8


def test_only_maps_and_random_maps_are_taken():
  with pytest.raises(TypeError, match='neither a grain Map nor a RandomMap'):
    shuffled(
        packing.as_source(ROWS),
        batch_size=4,
        seed=0,
        transforms=[ShortRows()],
    )


def test_the_batch_source_pickles_for_worker_processes():
  source = loaders.ShuffledBatches(
      packing.as_source(ROWS),
      batch_size=4,
      seed=1,
      process_index=0,
      process_count=1,
      transforms=(),
      batch_transforms=(MASKING,),
  )
  copy = pickle.loads(pickle.dumps(source))
  assert repr(copy) == repr(source)
  for key, value in source[5].items():
    np.testing.assert_array_equal(copy[5][key], value)


@pytest.mark.parametrize('worker_count', [0, 1, 3])
def test_a_position_written_with_any_worker_count_counts_its_batches(worker_count):
  """grain's own reading of the state agrees: a loader set to it starts each
  worker at its next batch (checked without starting processes)."""
  batches = loaders.ShuffledBatches(
      packing.as_source(ROWS),
      batch_size=4,
      seed=0,
      process_index=0,
      process_count=1,
      transforms=(),
      batch_transforms=(),
  )
  for consumed in range(9):
    state = batches.state_after(consumed, worker_count)
    assert batches.consumed_batches(state) == consumed
    if worker_count:
      # grain's set_state: worker w's next batch index is next_index * W + w.
      workers = state['last_seen_indices']
      made = [(workers[str(w)] + worker_count - w) // worker_count for w in range(worker_count)]
      assert sum(made) == consumed
      assert (state['last_worker_index'] + 1) % worker_count == consumed % worker_count


@pytest.mark.slow
def test_worker_processes_give_the_batches_of_the_main_process():
  """Each worker makes whole batches, so the stream does not depend on
  worker_count (spawns two grain worker processes, which read the parsed
  absl flags as a command's would)."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  source = packing.as_source(ROWS)
  here = shuffled(source, batch_size=8, seed=2, batch_transforms=[MASKING])
  workers = shuffled(source, batch_size=8, seed=2, batch_transforms=[MASKING], worker_count=2)
  assert_same_batches(here, workers, 15)


@pytest.mark.slow
@pytest.mark.parametrize('written_with, resumed_with', [(2, 0), (0, 1)])
def test_a_run_resumes_with_another_worker_count(written_with, resumed_with):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  source = packing.as_source(ROWS)
  reading = dict(batch_size=8, seed=5, batch_transforms=[MASKING])
  first = shuffled(source, worker_count=written_with, **reading)
  for _ in range(7):
    next(first)
  resumed = shuffled(source, worker_count=resumed_with, **reading)
  resumed.set_state(first.get_state())
  assert_same_batches(first, resumed, 5)
