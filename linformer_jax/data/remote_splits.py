"""Prepared splits in a bucket (`config.data.prepared_dir=gs://...`).

ArrayRecord's reader opens local files only, and random access over the
network would cost a request per record. So a gs:// split is read through a
local mirror in the data cache: `download` copies its manifests and shards
there (a shard already there with the size its manifest records is not copied
again, so a restarted run copies nothing), and the run reads the mirror as a
local prepared split, with every check a local one has. A split prepared on
this host (the first run's process 0, or `prepare_data`) is prepared in the
mirror as a local one would be, then `upload`ed: shards first, manifests
last, so whoever sees a manifest in the bucket finds its shards there.
"""

import hashlib
import json
import pathlib
from typing import Optional

from linformer_jax import storage
from linformer_jax.data import cache
from linformer_jax.data.data_config import DataConfig


def remote_folder(data_config: DataConfig, split: str) -> Optional[str]:
  """gs://.../SPLIT when config.data.prepared_dir is in a bucket, else None."""
  prepared = data_config.prepared_dir
  if not storage.scheme_of(prepared):
    return None
  return storage.join(storage.location(prepared, 'config.data.prepared_dir'), split)


def mirror_folder(data_config: DataConfig, remote: str) -> pathlib.Path:
  """The local copy of the bucket's split `remote`, in the data cache."""
  digest = hashlib.sha256(remote.encode()).hexdigest()[:20]
  name = f'{remote.rstrip("/").rsplit("/", 1)[-1]}-gs-{digest}'
  return cache.cache_root(data_config.cache_dir) / 'prepared' / name


def _manifest_names(folder: str) -> list:
  if not storage.isdir(folder):
    return []
  return sorted(
      name
      for name in storage.listdir(folder)
      if name.startswith('part-') and name.endswith('.json')
  )


def _sync(source: str, destination: str) -> int:
  """Copies each manifest of `source` with the shards it lists that
  `destination` lacks (or holds at another size); returns the shards copied."""
  copied = 0
  for name in _manifest_names(source):
    text = storage.read_text(storage.join(source, name))
    for shard in json.loads(text).get('shards', []):
      target = storage.join(destination, shard['name'])
      if storage.exists(target) and storage.getsize(target) == shard['bytes']:
        continue
      storage.copy_file(storage.join(source, shard['name']), target)
      copied += 1
    target = storage.join(destination, name)
    if not storage.exists(target) or storage.read_text(target) != text:
      storage.write_text(target, text)
  return copied


def download(remote: str, folder: pathlib.Path) -> int:
  """Brings the bucket's split into the local `folder`; returns the shards copied."""
  if not _manifest_names(remote):
    return 0
  folder.mkdir(parents=True, exist_ok=True)
  return _sync(remote, str(folder))


def upload(folder: pathlib.Path, remote: str) -> int:
  """Puts the local split `folder` into the bucket; returns the shards copied."""
  return _sync(str(folder), remote)
