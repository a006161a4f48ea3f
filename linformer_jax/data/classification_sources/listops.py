"""The Long Range Arena's ListOps as a classification source
(config.data.source='listops').

The examples are generated from config.data.listops (`listops.ListOpsSettings`)
and cached under config.data.cache_dir by `linformer_jax.data.listops`; the
splits are 'train', 'validation' and 'test', the labels the 10 values. ListOps
has its own 16-symbol vocabulary (config.data.tokenizer='listops'), so the
examples are encoded here, one token per symbol, with no separators; trees of
up to max_length tokens must fit a row of seq_len. It trains on all of its
training examples (num_train sets their number).
"""

import numpy as np

from linformer_jax.data import cache
from linformer_jax.data import labelled_examples
from linformer_jax.data import listops
from linformer_jax.data.classification_sources import base
from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.encoding import EncodedSplit
from linformer_jax.errors import ConfigError


def generator_settings(data_config: DataConfig) -> listops.ListOpsSettings:
  """The generator's settings of config.data.listops."""
  return listops.ListOpsSettings(**dict(data_config.listops))


def _check_split(settings: listops.ListOpsSettings, split: str) -> None:
  if split not in settings.split_sizes:
    raise ConfigError(
        f'ListOps has splits {tuple(settings.split_sizes)}, not {split!r}; '
        'change config.data.train_split/eval_split.'
    )


@base.REGISTRY.register('listops')
class ListOps(base.ClassificationSource):
  """Generated expression trees, labelled with their values."""

  own_vocab_size = listops.VOCAB_SIZE

  def check(self, data_config, seq_len) -> None:
    settings = generator_settings(data_config)
    if settings.max_length > seq_len:
      raise ConfigError(
          f'config.data.listops.max_length={settings.max_length} is '
          f'longer than config.model.max_len={seq_len}; raise max_len.'
      )
    for split in (data_config.train_split, data_config.eval_split):
      _check_split(settings, split)

  def num_classes(self, data_config) -> int:
    del data_config
    return listops.NUM_CLASSES

  def examples(self, data_config, split) -> labelled_examples.Examples:
    settings = generator_settings(data_config)
    _check_split(settings, split)
    examples = listops.load_split(settings, cache.cache_root(data_config.cache_dir), split)
    return labelled_examples.Examples(
        [(source,) for source, _ in examples],
        np.asarray([label for _, label in examples], np.int32),
    )

  def encode(self, examples, seq_len) -> EncodedSplit:
    inputs = np.asarray([listops.encode(source, seq_len) for (source,) in examples.texts], np.int32)
    return EncodedSplit(inputs, np.zeros_like(inputs), examples.labels, listops.PAD_ID)
