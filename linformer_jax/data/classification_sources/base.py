"""What a classification data source is, and the registry of sources by name.

A source turns `config.data` and a split name into labelled examples
(`labelled_examples.Examples`: one tuple of 1 or 2 texts per example, and
their class indices). It says:

* `examples(data_config, split)`: the split's examples, in a fixed order.
* `num_classes(data_config)`: how many classes the labels index (by default
  the length of config.data.labels).
* `check(data_config, seq_len)`: refuses bad config.data fields before
  anything is read (by default those of labelled texts: truncation, labels,
  text_columns).
* `own_vocab_size`: None when the texts go through the run's tokenizer
  (config.data.tokenizer); the size of the source's own vocabulary when it
  encodes its examples itself (`encode`), as ListOps does.
* `settings`: fields of config.data of its own (`registry.Setting`), added to
  a command's config with their defaults (`registry.add_declared_settings`),
  checked before anything is read, and read with `setting(data_config, name)`.

`config.data.source` names the source in `REGISTRY` when config.task is
'classification'. A source of one's own is a subclass registered under a new
name, in a file named in `config.extensions`:

  from linformer_jax.data.classification_sources import base

  @base.REGISTRY.register('my_dataset')
  class MyDataset(base.ClassificationSource):
    def examples(self, data_config, split): ...
"""

import abc
from typing import Any, Optional, Tuple, Type

from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.encoding import EncodedSplit
from linformer_jax.data.labelled_examples import Examples
from linformer_jax.errors import ConfigError
from linformer_jax.registry import Registry
from linformer_jax.registry import Setting

TRUNCATIONS = ('head', 'head_tail')


class ClassificationSource(abc.ABC):
  """The labelled examples of a classification dataset, by split; see the
  module docstring. Subclasses hold no state: `config.data` is passed to every
  method."""

  # The size of the source's own vocabulary, whose ids `encode` gives; None:
  # the texts are tokenized by the run's tokenizer.
  own_vocab_size: Optional[int] = None
  # Fields of config.data the source declares for itself.
  settings: Tuple[Setting, ...] = ()

  @abc.abstractmethod
  def examples(self, data_config: DataConfig, split: str) -> Examples:
    """The examples of `split`, in a fixed order.

    Raises:
      ConfigError: the split does not exist, or its data cannot be read; the
        message names the config field to change.
    """

  def num_classes(self, data_config: DataConfig) -> int:
    """The number of classes the labels index."""
    return len(data_config.labels)

  def check(self, data_config: DataConfig, seq_len: int) -> None:
    """Refuses bad config.data fields before anything is read (the examples
    will be laid out in rows of `seq_len` tokens)."""
    del seq_len
    check_text_fields(data_config)

  def setting(self, data_config: DataConfig, name: str) -> Any:
    """config.data.NAME, a setting this source declares (its default unless
    the config sets it)."""
    if any(setting.name == name for setting in self.settings):
      return data_config.setting(name)
    raise ValueError(f'{type(self).__name__} declares no setting {name!r} in `settings`.')

  def encode(self, examples: Examples, seq_len: int) -> EncodedSplit:
    """The examples as rows of `seq_len` ids of the source's own vocabulary;
    needed only when `own_vocab_size` is set."""
    raise NotImplementedError(f'{type(self).__name__} has no vocabulary of its own.')


def check_text_fields(data_config: DataConfig) -> None:
  """Refuses config.data.truncation, labels and text_columns that labelled
  texts cannot have."""
  truncation, labels = data_config.truncation, data_config.labels
  text_columns = data_config.text_columns
  if truncation not in TRUNCATIONS:
    raise ConfigError(
        f'config.data.truncation={truncation!r} is not allowed; use one of {TRUNCATIONS}.'
    )
  if len(labels) < 2 or len(set(map(str, labels))) != len(labels):
    raise ConfigError(
        f'config.data.labels={tuple(labels)} is not allowed; give two or more distinct labels.'
    )
  if len(text_columns) not in (1, 2):
    raise ConfigError(
        f'config.data.text_columns={tuple(text_columns)} is not '
        'allowed; name 1 (single texts) or 2 (pairs) columns.'
    )


REGISTRY: Registry[Type[ClassificationSource]] = Registry(
    'config.data.source', declares_settings=True
)


def source_of(data_config: DataConfig) -> ClassificationSource:
  """The source config.data.source names; ConfigError listing the names otherwise."""
  name = data_config.source
  if name not in REGISTRY:
    raise ConfigError(
        f'config.data.source={name!r} is not allowed for task=classification; use one of '
        f'{REGISTRY.names()} (a source of your own registers itself in a file named in '
        'config.extensions).'
    )
  return REGISTRY.get(name)()


def checked_source(data_config: DataConfig, seq_len: int) -> ClassificationSource:
  """`source_of`, once its declared settings and `check` accept config.data."""
  source = source_of(data_config)
  for setting in source.settings:
    value = source.setting(data_config, setting.name)
    if not setting.allows(value):
      raise ConfigError(f'config.data.{setting.name}={value!r} is not allowed; {setting.allowed}.')
  source.check(data_config, seq_len)
  return source
