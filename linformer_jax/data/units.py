"""A pretraining split as *units*: pieces of its documents small enough to hold
in memory, in the order they are packed.

Each source lists its own units (`sources.base.PretrainingSource.units`): a
text file or a 32 MiB block of a larger one, a range of examples of a TFDS
split stored as ArrayRecord (read with random access: no pass over the
dataset), or a chunk of documents already read (the embedded corpus, a
streamed dataset, a source of one's own). Units are what preparation workers
read and tokenize, what hosts divide among themselves, and what the
tokenizer's training sample is drawn from.
"""

from typing import Iterator, List

import numpy as np

from linformer_jax.data import sources
from linformer_jax.data.data_config import DataConfig

Unit = sources.base.Unit


def split_units(data_config: DataConfig, split: str) -> Iterator[Unit]:
  """The units of a split, in the order its documents are packed."""
  return sources.source_of(data_config).units(data_config, split)


def unit_documents(unit: Unit) -> List[str]:
  """The documents of one unit."""
  return unit.documents()


def sample_documents(
    data_config: DataConfig, split: str, max_chars: int, seed: int = 0
) -> Iterator[str]:
  """At most about `max_chars` of the split's documents, streamed.

  From a source whose units know their sizes (`samples_whole_units`): the
  whole split, in order, when it fits, otherwise whole units in a seeded
  random order until the budget is spent (only their sizes are held). From any
  other source: its first documents, in order, up to the budget.
  """
  source = sources.source_of(data_config)
  if not source.samples_whole_units:
    used = 0
    for document in source.documents(data_config, split):
      if used >= max_chars:
        return
      used += len(document)
      yield document
    return
  units = list(source.units(data_config, split))
  sizes = [unit.size() for unit in units]
  order = (
      range(len(units))
      if sum(sizes) <= max_chars
      else np.random.default_rng(seed).permutation(len(units))
  )
  used = 0
  for index in order:
    if used >= max_chars:
      return
    used += sizes[index]
    yield from units[index].documents()
