"""A pretraining source of one's own: JSON-lines files of {"text": ...} records.

config.data.path names a folder with one file per split, SPLIT.jsonl (e.g.
train.jsonl and validation.jsonl); each line is a JSON object whose "text"
field is one document. Naming this file in config.extensions registers the
source as config.data.source='jsonl' for every command:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/jsonl \
      --config.extensions="('docs/examples/jsonl_source.py',)" \
      --config.data.source=jsonl --config.data.path=path/to/folder

The run trains its tokenizer on train.jsonl, prepares both splits as shards in
the data cache, and evaluates on validation.jsonl, as for the sources the
package ships (docs/data.md).
"""

import json
import pathlib
from typing import Any, Dict, Iterator

from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.sources import base
from linformer_jax.errors import ConfigError

# The field of each record that holds its text.
TEXT_FIELD = 'text'


def split_file(data_config: DataConfig, split: str) -> pathlib.Path:
  """config.data.path/SPLIT.jsonl; ConfigError saying what to fix when missing."""
  folder = pathlib.Path(data_config.path).expanduser()
  path = folder / f'{split}.jsonl'
  if not data_config.path or not path.is_file():
    raise ConfigError(
        f"config.data.source='jsonl' reads {split}.jsonl in config.data.path="
        f'{data_config.path!r}, which has none; set config.data.path to a folder '
        'holding it, or change config.data.train_split/eval_split.'
    )
  return path


def read_texts(path: pathlib.Path) -> Iterator[str]:
  """The non-empty "text" of each record, in file order."""
  with open(path, encoding='utf-8') as lines:
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        continue
      record = json.loads(line)
      if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
        raise ConfigError(f'{path}:{number} is not a JSON object with a string "{TEXT_FIELD}".')
      if record[TEXT_FIELD].strip():
        yield record[TEXT_FIELD]


@base.REGISTRY.register('jsonl')
class JsonLines(base.PretrainingSource):
  """One document per record of config.data.path/SPLIT.jsonl.

  Only `documents` and `signature` are needed: the default units carry chunks
  of the documents read here to the preparation workers.
  """

  def documents(self, data_config: DataConfig, split: str) -> Iterator[str]:
    # Looked up now, so that a missing file fails before any work starts.
    return read_texts(split_file(data_config, split))

  def signature(self, data_config: DataConfig, split: str) -> Dict[str, Any]:
    # The file's size and modification time change when it is rewritten, so a
    # cached preparation of the old file is never read for the new one.
    path = split_file(data_config, split)
    stat = path.stat()
    return {'file': str(path.resolve()), 'bytes': stat.st_size, 'mtime_ns': stat.st_mtime_ns}
