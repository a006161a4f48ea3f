"""The documents of a pretraining split, from the source config.data.source names.

`iter_documents(config.data, split)` streams them; `load_documents` lists them
(for small data). What each source reads lives in its own module under
`sources` (`sources.embedded`, `sources.text_files`, `sources.tfds`, or a
source registered from a file in config.extensions). Documents come in a
deterministic order; splits are fixed by titles or file names, never by random
state, so every run sees the same data.
"""

from typing import Iterator, List

from linformer_jax.data import sources
from linformer_jax.data.data_config import DataConfig


def iter_documents(data_config: DataConfig, split: str) -> Iterator[str]:
  """The documents of `split` from the source `config.data.source` names,
  streamed (text files are read one at a time, TFDS examples one by one).

  Raises:
    ConfigError: an unknown source (the message lists the registered ones), a
      missing split, or data that cannot be read.
  """
  return sources.source_of(data_config).documents(data_config, split)


def load_documents(data_config: DataConfig, split: str) -> List[str]:
  """All documents of `split` in memory (see `iter_documents`); for small data."""
  return list(iter_documents(data_config, split))
