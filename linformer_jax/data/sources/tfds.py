"""TFDS text datasets as a pretraining source (config.data.source='tfds').

Any TFDS text dataset (wiki40b, pg19, lm1b, ...) that the machine has prepared
in config.data.tfds_data_dir, or may download (config.data.tfds_download).
A dataset stored as ArrayRecord is read with random access: its units are
ranges of example indices, listed without a pass over the data. Any other
format streams once, in chunks of documents. `tfds_examples` also serves the
classification data.
"""

import dataclasses
import re
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.sources import base
from linformer_jax.errors import ConfigError

# Structure markers of wiki40b's text, turned back into plain text.
_WIKI40B_MARKERS = re.compile(r'\n?_START_(ARTICLE|SECTION|PARAGRAPH)_\n')


def tfds_examples(
    name: str,
    split: str,
    features: Sequence[str],
    data_dir: Optional[str] = None,
    download: bool = False,
    field: str = 'config.data.tfds_text_key',
) -> Iterable[Dict[str, Any]]:
  """The examples (numpy dicts) of a prepared TFDS split, checked first.

  Args:
    name: TFDS name, with config if any ('wiki40b/en', 'glue/sst2').
    split: TFDS split ('train', 'validation', 'test', or a slice 'train[:1%]').
    features: the features the caller reads; a missing one is an error.
    data_dir: TFDS data_dir (None or '' for the TFDS default).
    download: download and prepare the dataset if missing. Off by default:
      without network TFDS retries for minutes before failing.
    field: the config field that names `features`, for the error message.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except tfds.core.registered.DatasetNotFoundError as error:
    raise ConfigError(f'config.data.tfds_name={name!r} is not a TFDS dataset.') from error
  if not builder.is_prepared():
    if not download:
      raise ConfigError(
          f'TFDS dataset {name!r} is not prepared in config.data.tfds_data_dir='
          f'{data_dir!r}; set config.data.tfds_download=True (needs network) or '
          'prepare it there with `tfds build`.'
      )
    builder.download_and_prepare()
  base_split = split.split('[')[0]
  if base_split not in builder.info.splits:
    raise ConfigError(
        f'TFDS dataset {name!r} has no split {base_split!r} (it has '
        f'{sorted(builder.info.splits)}); change '
        'config.data.train_split/eval_split.'
    )
  for feature in features:
    if feature not in builder.info.features:
      raise ConfigError(
          f'{field}: {feature!r} is not a feature of {name!r} '
          f'(features: {sorted(builder.info.features)}).'
      )
  return tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))


def tfds_text(example: Mapping[str, Any], text_key: str) -> str:
  """The plain text of a TFDS example (wiki40b's structure markers undone)."""
  text = example[text_key]
  text = text.decode('utf-8') if isinstance(text, bytes) else str(text)
  return _WIKI40B_MARKERS.sub('\n', text).replace('_NEWLINE_', '\n').strip()


def iter_tfds_documents(
    name: str,
    split: str,
    text_key: str = 'text',
    data_dir: Optional[str] = None,
    download: bool = False,
) -> Iterator[str]:
  """Documents of a TFDS text dataset, e.g. 'wiki40b/en', 'pg19', 'lm1b', streamed
  one example at a time; see `tfds_examples` for the arguments."""
  found = False
  for example in tfds_examples(name, split, [text_key], data_dir, download):
    text = tfds_text(example, text_key)
    if text:
      found = True
      yield text
  if not found:
    raise ConfigError(
        f'Split {split!r} of TFDS dataset {name!r} has no text in '
        f'feature config.data.tfds_text_key={text_key!r}.'
    )


_TFDS_SOURCES: Dict[Tuple[str, str, str], Any] = {}


def _tfds_source(name: str, split: str, data_dir: str) -> Any:
  """tfds.data_source of a split, opened once per process."""
  key = (name, split, data_dir)
  if key not in _TFDS_SOURCES:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    _TFDS_SOURCES[key] = tfds.data_source(
        name, split=split, data_dir=data_dir or None, download=False
    )
  return _TFDS_SOURCES[key]


@dataclasses.dataclass(frozen=True)
class ExampleRange(base.Unit):
  """Examples start..stop of a TFDS split stored as ArrayRecord."""

  name: str
  split: str
  data_dir: str
  text_key: str
  start: int
  stop: int

  def documents(self) -> List[str]:
    source = _tfds_source(self.name, self.split, self.data_dir)
    texts = (tfds_text(source[index], self.text_key) for index in range(self.start, self.stop))
    return [text for text in texts if text]


def _array_record_units(data_config: DataConfig, split: str) -> Optional[List[base.Unit]]:
  """Index ranges of a TFDS split stored as ArrayRecord (no pass over it), or
  None when the dataset is in another format (then it streams once)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  name, data_dir = data_config.tfds_name, data_config.tfds_data_dir
  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except Exception:  # pylint: disable=broad-except
    return None  # `documents` reports an unknown dataset in one line
  if not builder.is_prepared() or builder.info.file_format != tfds.core.FileFormat.ARRAY_RECORD:
    return None
  count = len(_tfds_source(name, split, data_dir))
  key = data_config.tfds_text_key
  return [
      ExampleRange(name, split, data_dir, key, start, min(start + base.DOCUMENTS_PER_UNIT, count))
      for start in range(0, count, base.DOCUMENTS_PER_UNIT)
  ]


@base.REGISTRY.register('tfds')
class Tfds(base.PretrainingSource):
  """config.data.tfds_name's examples, their config.data.tfds_text_key feature."""

  def documents(self, data_config, split) -> Iterator[str]:
    if not data_config.tfds_name:
      raise ConfigError(
          "config.data.tfds_name is empty; set it to a TFDS dataset, e.g. 'wiki40b/en'."
      )
    return iter_tfds_documents(
        data_config.tfds_name,
        split,
        data_config.tfds_text_key,
        data_config.tfds_data_dir or None,
        bool(data_config.tfds_download),
    )

  def units(self, data_config, split) -> Iterator[base.Unit]:
    if data_config.tfds_name:
      units = _array_record_units(data_config, split)
      if units is not None:
        yield from units
        return
    yield from base.document_chunks(self.documents(data_config, split))

  def signature(self, data_config, split) -> Dict[str, Any]:
    """The dataset's name, text feature and data_dir."""
    del split
    return {
        'name': data_config.tfds_name,
        'key': data_config.tfds_text_key,
        'data_dir': data_config.tfds_data_dir,
    }
