"""A prepared TFDS dataset as a classification source (config.data.source='tfds').

config.data.tfds_name names it ('glue/sst2', 'glue/qnli', 'glue/qqp',
'imdb_reviews'), text_columns and label_column name its features, and its
integer labels index config.data.labels. It is read through the pretraining
source's `tfds_examples`, with the same data_dir and download fields.
"""

import numpy as np

from linformer_jax.data import labelled_examples
from linformer_jax.data.classification_sources import base
from linformer_jax.data.sources import tfds as tfds_source
from linformer_jax.errors import ConfigError


@base.REGISTRY.register('tfds')
class Tfds(base.ClassificationSource):
  """config.data.tfds_name's examples: their text and label features."""

  def examples(self, data_config, split) -> labelled_examples.Examples:
    name, labels = data_config.tfds_name, data_config.labels
    text_columns, label_column = data_config.text_columns, data_config.label_column
    if not name:
      raise ConfigError(
          "config.data.tfds_name is empty; set it to a TFDS dataset, e.g. 'glue/sst2'."
      )
    texts, label_ids = [], []
    for example in tfds_source.tfds_examples(
        name,
        split,
        [*text_columns, label_column],
        data_config.tfds_data_dir or None,
        bool(data_config.tfds_download),
        field='config.data.text_columns/label_column',
    ):
      label = int(example[label_column])
      if not 0 <= label < len(labels):
        raise ConfigError(
            f'TFDS {name!r} split {split!r} has label {label}, outside '
            f'config.data.labels={tuple(labels)} (TFDS labels index it).'
        )
      texts.append(tuple(example[c].decode('utf-8') for c in text_columns))
      label_ids.append(label)
    if not texts:
      raise ConfigError(f'TFDS {name!r} split {split!r} has no examples.')
    return labelled_examples.Examples(texts, np.asarray(label_ids, np.int32))
