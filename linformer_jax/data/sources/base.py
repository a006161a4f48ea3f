"""What a pretraining data source is, and the registry of sources by name.

A source turns `config.data` and a split name into documents (plain-text
strings). It says three things:

* `documents(data_config, split)`: the split's documents, streamed, in a fixed
  order (splits fixed by names or hashes, never by random state).
* `units(data_config, split)`: the same documents as *units*, pieces small
  enough to hold in memory, in the same order. Preparation workers read and
  tokenize units in parallel, hosts divide them among themselves, and the
  tokenizer's sample is drawn from them. By default a unit is a chunk of
  DOCUMENTS_PER_UNIT documents read by `documents`; a source whose data allows
  random access (files, ArrayRecord) lists units that read themselves instead.
* `signature(data_config, split)`: everything the split's documents depend on
  (file names, sizes and times, a dataset's name), cheap to compute. Prepared
  shards are cached under a digest of it, and a manifest prepared from other
  data is refused.

`config.data.source` names the source in `REGISTRY`. A source of one's own is a
subclass registered under a new name, in a file named in `config.extensions`:

  from linformer_jax.data.sources import base

  @base.REGISTRY.register('my_corpus')
  class MyCorpus(base.PretrainingSource):
    def documents(self, data_config, split): ...
    def signature(self, data_config, split): ...

Units go to worker processes that do not import such a file, so a source of
one's own keeps the default units (chunks of documents, read here).
"""

import abc
import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Tuple, Type

from linformer_jax.data.data_config import DataConfig
from linformer_jax.registry import Registry

# Documents of a streamed source go to the workers in chunks of this many.
DOCUMENTS_PER_UNIT = 64


class Unit(abc.ABC):
  """A piece of a split small enough to hold in memory; pickled to workers."""

  @abc.abstractmethod
  def documents(self) -> List[str]:
    """The unit's documents, in order."""

  def size(self) -> int:
    """Characters (or bytes on disk) of the unit, to budget samples; needed
    only by a source whose `samples_whole_units` is True."""
    raise NotImplementedError(f'{type(self).__name__} has no size.')


@dataclasses.dataclass(frozen=True)
class DocumentChunk(Unit):
  """Documents already read, carried to a worker as they are."""

  texts: Tuple[str, ...]

  def documents(self) -> List[str]:
    return list(self.texts)

  def size(self) -> int:
    return sum(len(text) for text in self.texts)


def document_chunks(documents: Iterable[str]) -> Iterator[DocumentChunk]:
  """Streamed documents in chunks of DOCUMENTS_PER_UNIT (the last may be short)."""
  chunk: List[str] = []
  for document in documents:
    chunk.append(document)
    if len(chunk) == DOCUMENTS_PER_UNIT:
      yield DocumentChunk(tuple(chunk))
      chunk = []
  if chunk:
    yield DocumentChunk(tuple(chunk))


class PretrainingSource(abc.ABC):
  """The documents of a pretraining corpus, by split; see the module docstring.

  Subclasses hold no state: `config.data` is passed to every method.
  """

  # True when listing the units reads no text and their sizes are cheap, so a
  # tokenizer sample may take whole units at random; otherwise the sample is
  # the split's first documents, streamed in order.
  samples_whole_units = False

  @abc.abstractmethod
  def documents(self, data_config: DataConfig, split: str) -> Iterator[str]:
    """The documents of `split`, streamed in a fixed order.

    Raises:
      ConfigError: the split does not exist, or its data cannot be read; the
        message names the config field to change.
    """

  def units(self, data_config: DataConfig, split: str) -> Iterator[Unit]:
    """The split as units holding its documents in the same order."""
    return document_chunks(self.documents(data_config, split))

  @abc.abstractmethod
  def signature(self, data_config: DataConfig, split: str) -> Dict[str, Any]:
    """JSON values that change whenever the documents of `split` may change
    (the source's name and the split are added by the caller)."""


REGISTRY: Registry[Type[PretrainingSource]] = Registry('config.data.source')


def source_of(data_config: DataConfig) -> PretrainingSource:
  """The source config.data.source names; ConfigError listing the names otherwise."""
  return REGISTRY.get(data_config.source)()
