"""config.data, typed and checked once: `DataConfig.of(config.data, task)`.

Every field is declared once here with `settings_flags.setting`: its type,
help and bounds, and for a field added since the first runs, `before`, the
value a run saved earlier had (`run_config.complete` gives an old config.json
those values). `DataConfig` holds the fields every task's config has
(configs/default.py); `ClassificationDataConfig` adds the labelled examples'
(configs/classification.py). The settings a registered source declares for
itself (`registry.Setting`, section config.data) are in
`extension_settings`, read with `setting(name)`.

The data layer reads config.data only through these objects.
"""

import dataclasses
from typing import Any, Dict, Mapping, Tuple, Type

from linformer_jax import registry
from linformer_jax import settings_flags
from linformer_jax.settings_flags import setting

# The config section the data sources' declared settings are fields of.
SECTION = 'config.data'
# What a tokenizer trains on by default, at most (config.data.tokenizer_sample_chars).
TOKENIZER_SAMPLE_CHARS = 100_000_000


def _fraction(value: float) -> bool:
  return 0 < value < 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """config.data's fields every task has; see configs/default.py."""

  source: str = setting(help_text='the registered source of the text', before='embedded')
  path: str = setting(help_text="text file or folder of the source ('' = none)")
  split_files: Mapping[str, Any] = setting(
      help_text='split -> list of file names; train = all the others', before={}
  )
  tfds_name: str = setting(help_text="TFDS dataset for source='tfds'", before='')
  tfds_text_key: str = setting(help_text='the TFDS feature holding the text', before='text')
  tfds_data_dir: str = setting(help_text="TFDS data_dir ('' = its default)", before='')
  tfds_download: bool = setting(help_text='let TFDS download (needs network)', before=False)
  train_split: str = setting(help_text='split to train on')
  eval_split: str = setting(help_text='split evaluated during training')
  tokenizer: str = setting(help_text="'sentencepiece', 'byte', or a tokenizer file")
  vocab_size: int = setting(help_text='vocabulary size', minimum=1)
  mask_rate: float = setting(
      help_text='fraction of tokens masked', check=_fraction, allowed='use a value in (0, 1)'
  )
  cache_dir: str = setting(
      help_text="cache for extracted and packed data ('' = default)", before=''
  )
  prepared_dir: str = setting(
      help_text="prepared shards of each split ('' = in the cache)", before=''
  )
  prepare_workers: int = setting(
      help_text='tokenizing processes (0 = all cores)', minimum=0, before=0
  )
  sequences_per_shard: int = setting(
      help_text='packed sequences per ArrayRecord shard', minimum=1, before=8192
  )
  max_eval_batches: int = setting(help_text='cap on evaluation batches (0 = all)', minimum=0)
  worker_count: int = setting(
      help_text='grain worker processes making batches (0 = in the main process)',
      minimum=0,
      before=0,
  )
  read_threads: int = setting(
      help_text='threads making batches ahead in this process (0 = none)', minimum=0, before=0
  )
  prefetch_buffer: int = setting(help_text='batches those threads keep ready', minimum=0, before=0)
  tokenizer_sample_chars: int = setting(
      help_text='text the tokenizer trains on, at most',
      minimum=1,
      before=TOKENIZER_SAMPLE_CHARS,
  )
  # The settings registered sources declare (`registry.Setting`), by name;
  # see `setting`.
  extension_settings: Tuple[Tuple[str, Any], ...] = ()

  @classmethod
  def of(cls, data: Mapping[str, Any], task: str = '') -> 'DataConfig':
    """config.data typed: a `ClassificationDataConfig` for task='classification'.

    Raises:
      ConfigError: a field of the wrong type or out of its bounds, naming it.
    """
    section_type = SECTION_OF_TASK.get(task, cls) if cls is DataConfig else cls
    declared = registry.declared_settings(SECTION)
    own = set(settings_flags.config_fields(section_type))
    extension_settings = tuple(
        sorted((name, data[name]) for name in declared if name not in own and name in data)
    )
    return settings_flags.from_config(
        section_type, data, SECTION, extension_settings=extension_settings
    )

  def setting(self, name: str) -> Any:
    """config.data.NAME, a setting a registered source declares (its default
    unless the config sets it), in its declared type.

    Raises:
      ConfigError: no registered source declares `name`.
    """
    return registry.declared_value(SECTION, name, self.extension_settings, 'source')

  def to_dict(self) -> Dict[str, Any]:
    """The fields as config.data holds them, the declared settings included."""
    fields = {name: getattr(self, name) for name in settings_flags.config_fields(type(self))}
    return {**fields, **dict(self.extension_settings)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassificationDataConfig(DataConfig):
  """config.data of a classification run: the labelled examples' fields too;
  see configs/classification.py."""

  text_columns: Tuple[str, ...] = setting(help_text='1 column (single texts) or 2 (pairs)')
  label_column: str = setting(help_text='column or TFDS feature holding the label')
  labels: Tuple[str, ...] = setting(help_text='label values, in class-index order')
  seq_len: int = setting(
      help_text='tokens per example, <= model.max_len (0 = max_len)', minimum=0, before=0
  )
  truncation: str = setting(help_text="longer texts: keep the 'head' or 'head_tail' halves")
  max_train_examples: int = setting(
      help_text='a random subset of the training split (0 = all)', minimum=0, before=0
  )
  listops: Mapping[str, Any] = setting(
      help_text="the ListOps generator's settings (source='listops')", before={}
  )


# The data section of each task whose config.data has fields of its own; any
# other task's is `DataConfig`.
SECTION_OF_TASK: Dict[str, Type[DataConfig]] = {'classification': ClassificationDataConfig}
