"""Local TSV files as a classification source (config.data.source='tsv').

config.data.path is the folder, config.data.split_files maps a split to its
file(s) there, text_columns and label_column name the columns of the header
row and labels lists the label values in class order: e.g.
../shared/data/glue_sst2 (`sentence<TAB>label`) or ../shared/data/imdb
(`label<TAB>rating<TAB>file<TAB>text`). `labelled_examples.read_tsv` reads
each file.
"""

import os
import pathlib
from typing import List

import numpy as np

from linformer_jax.data import labelled_examples
from linformer_jax.data.classification_sources import base
from linformer_jax.data.data_config import DataConfig
from linformer_jax.errors import ConfigError


def split_files(data_config: DataConfig, split: str) -> List[pathlib.Path]:
  """The files config.data.split_files lists for `split`, each checked to exist."""
  files = dict(data_config.split_files or {}).get(split)
  if not files:
    raise ConfigError(
        f'config.data.split_files has no files for split {split!r}; '
        f"add e.g. {{'{split}': ['{split}.tsv']}}."
    )
  if isinstance(files, str):
    files = [files]
  folder = data_config.path
  if '://' in folder:
    raise ConfigError(
        f'config.data.path={folder!r} is a URL; TSV files are read from a local folder: '
        'copy them to this machine.'
    )
  paths = [pathlib.Path(os.path.expanduser(folder)) / name for name in files]
  for path in paths:
    if not path.is_file():
      raise ConfigError(
          f'{path} does not exist; set config.data.path to the folder '
          'holding config.data.split_files.'
      )
  return paths


@base.REGISTRY.register('tsv')
class TsvFiles(base.ClassificationSource):
  """The rows of config.data.split_files[split], file after file."""

  def examples(self, data_config, split) -> labelled_examples.Examples:
    parts = [
        labelled_examples.read_tsv(
            path, data_config.text_columns, data_config.label_column, data_config.labels
        )
        for path in split_files(data_config, split)
    ]
    return labelled_examples.Examples(
        [t for part in parts for t in part.texts], np.concatenate([part.labels for part in parts])
    )
