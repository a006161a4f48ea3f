"""Streaming preparation of a pretraining split: documents to ArrayRecord shards.

A split's documents come as a sequence of *units* (`units`), each small
enough to hold in memory: a text file (or a 32 MiB block of a larger one), or
a chunk of documents of the embedded corpus or of a TFDS dataset. Worker processes (all
cores by default) read and tokenize units in parallel; this process packs
their token streams, in order, with the FULL-SENTENCES rule of
`packing.Packer` (documents joined by eos, cut into rows of
bos + seq_len - 2 tokens + eos) and writes the rows to shards
(`shards.ShardWriter`). At most two units per worker are in flight, so memory
stays bounded whatever the corpus size.

After each shard the part's manifest records the units done and the tokens
carried into the next row, so a killed preparation resumes there. Several
hosts can prepare one split together: part I of N takes units I, I+N, ...
"""

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import pathlib
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from linformer_jax.data import cache
from linformer_jax.data import packing
from linformer_jax.data import remote_splits
from linformer_jax.data import shards
from linformer_jax.data import sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import units
from linformer_jax.data import worker_lifetime
from linformer_jax.data.data_config import DataConfig
from linformer_jax.errors import ConfigError

# ---------------------------------------------------------------- workers

_WORKER_TOKENIZER: Optional[tokenizer_lib.Tokenizer] = None


def _start_worker(tokenizer_spec: Tuple[str, str], parent_pid: int) -> None:
  global _WORKER_TOKENIZER
  worker_lifetime.end_with_parent(parent_pid)
  kind, path = tokenizer_spec
  # One thread each: the pool's processes are the parallelism (the tokenizers
  # library reads its thread count when it first encodes).
  os.environ['RAYON_NUM_THREADS'] = '1'
  _WORKER_TOKENIZER = (
      tokenizer_lib.ByteTokenizer()
      if kind == 'byte'
      else tokenizer_lib.load_file(kind, path, threads=1)
  )


def tokenize_unit(
    unit: units.Unit, tokenizer: Optional[tokenizer_lib.Tokenizer] = None
) -> np.ndarray:
  """The unit's documents tokenized and joined by eos, as one int32 stream."""
  tokenizer = tokenizer or _WORKER_TOKENIZER
  pieces = []
  for tokens in tokenizer.encode_all(units.unit_documents(unit)):
    if pieces:
      pieces.append(np.array([tokenizer.eos_id], np.int32))
    pieces.append(np.asarray(tokens, np.int32))
  return np.concatenate(pieces) if pieces else np.zeros([0], np.int32)


def _tokenizer_spec(tokenizer: tokenizer_lib.Tokenizer) -> Tuple[str, str]:
  if isinstance(tokenizer, tokenizer_lib.ByteTokenizer):
    return ('byte', '')
  if isinstance(tokenizer, tokenizer_lib.HuggingFaceTokenizer):
    return ('huggingface', tokenizer.model_path)
  return ('sentencepiece', tokenizer.model_path)


def _ordered_map(
    function: Callable[..., np.ndarray],
    work: Iterable[units.Unit],
    tokenizer: tokenizer_lib.Tokenizer,
    workers: int,
) -> Iterator[np.ndarray]:
  """function(unit) for each unit, in order, on `workers` processes (0: here),
  with at most 2 * workers units read ahead."""
  if workers == 0:
    for unit in work:
      yield function(unit, tokenizer)
    return
  # 'spawn': this process may run JAX's threads, which fork would copy broken.
  context = multiprocessing.get_context('spawn')
  with context.Pool(
      workers, initializer=_start_worker, initargs=(_tokenizer_spec(tokenizer), os.getpid())
  ) as pool:
    pending: List[Any] = []
    for unit in work:
      pending.append(pool.apply_async(function, (unit,)))
      if len(pending) >= 2 * workers:
        yield pending.pop(0).get()
    while pending:
      yield pending.pop(0).get()


# ---------------------------------------------------------------- preparation


def prepare_part(
    data_config: DataConfig,
    split: str,
    folder: pathlib.Path,
    *,
    tokenizer: tokenizer_lib.Tokenizer,
    seq_len: int,
    signature: Mapping[str, Any],
    workers: int = 0,
    sequences_per_shard: int = 8192,
    part_index: int = 0,
    part_count: int = 1,
) -> Dict[str, Any]:
  """Prepares (or finishes preparing) part `part_index` of `part_count` of a split.

  Returns the part's complete manifest. A complete part is returned as it is;
  an incomplete one resumes after its last finished shard.
  """
  if seq_len < 3:
    raise ConfigError(
        f'config.model.max_len={seq_len} is too short: a sequence needs bos, '
        'eos and at least one token (use >= 3).'
    )
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / shards.manifest_name(part_index, part_count)
  manifest = shards.read_manifest(path)
  if manifest is not None:
    shards.check_signature(manifest, signature, path)
    if manifest['complete']:
      return manifest
  shards.remove_temporary_files(folder, part_index, part_count)
  manifest = manifest or {
      'version': shards.MANIFEST_VERSION,
      'signature': dict(signature),
      'part_index': part_index,
      'part_count': part_count,
      'complete': False,
      'units_done': 0,
      'carry': [],
      'started': False,
      'shards': [],
      'sequences': 0,
      'tokens': 0,
      'unigram_counts': [0] * tokenizer.vocab_size,
  }
  content = hashlib.sha256()
  for shard in manifest['shards']:  # the digest runs over every row, in order
    for record in shards.read_records(folder / shard['name']):
      content.update(record)
  counts = np.asarray(manifest['unigram_counts'], np.int64)
  packer = packing.Packer(
      seq_len,
      bos_id=tokenizer.bos_id,
      eos_id=tokenizer.eos_id,
      pad_id=tokenizer.pad_id,
      carry=manifest['carry'],
      started=manifest['started'],
  )
  writer: Optional[shards.ShardWriter] = None

  def write(rows: np.ndarray) -> None:
    nonlocal writer, counts
    if not len(rows):
      return
    if writer is None:
      writer = shards.ShardWriter(
          folder, shards.shard_name(part_index, part_count, len(manifest['shards']))
      )
    writer.write(rows)
    content.update(np.ascontiguousarray(rows).tobytes())
    real = rows[rows != tokenizer.pad_id]
    counts += np.bincount(real, minlength=tokenizer.vocab_size)
    manifest['sequences'] += len(rows)
    manifest['tokens'] += int(real.size)

  def close_shard(units_done: int) -> None:
    nonlocal writer
    if writer is not None:
      manifest['shards'].append(writer.close())
      writer = None
    manifest.update(
        units_done=units_done,
        carry=packer.carry.tolist(),
        started=packer.started,
        unigram_counts=counts.tolist(),
    )
    shards.write_json_atomically(path, manifest)

  mine = (
      unit
      for index, unit in enumerate(units.split_units(data_config, split))
      if index % part_count == part_index
  )
  done = manifest['units_done']
  remaining = (unit for index, unit in enumerate(mine) if index >= done)
  for offset, stream in enumerate(_ordered_map(tokenize_unit, remaining, tokenizer, workers)):
    write(packer.add(stream))
    done_now = done + offset + 1
    if writer is not None and writer.sequences >= sequences_per_shard:
      close_shard(done_now)
  write(packer.finish())
  if manifest['sequences'] == 0 and part_count == 1:
    raise ConfigError(
        f'Split {split!r} holds no tokens; check config.data.source and its path or dataset.'
    )
  manifest['content_sha256'] = content.hexdigest()
  manifest['complete'] = True
  close_shard(manifest['units_done'])  # units_done no longer matters
  return manifest


def source_signature(data_config: DataConfig, split: str) -> Dict[str, Any]:
  """Everything the documents of `split` depend on: the source's name, the
  split and the source's own `signature` (file names, sizes and modification
  times, a dataset's name; never the text, so it is cheap)."""
  source = sources.source_of(data_config)
  return {
      'source': data_config.source,
      'split': split,
      **source.signature(data_config, split),
  }


def split_signature(
    data_config: DataConfig, split: str, tokenizer: tokenizer_lib.Tokenizer, seq_len: int
) -> Dict[str, Any]:
  """What a prepared split depends on; its manifest must match it."""
  return {
      'data': source_signature(data_config, split),
      'tokenizer': tokenizer.fingerprint,
      'seq_len': seq_len,
      'document_chars': sources.text_files.TEXT_FILE_DOCUMENT_CHARS,
  }


def split_folder(data_config: DataConfig, split: str, signature: Mapping[str, Any]) -> pathlib.Path:
  """config.data.prepared_dir/SPLIT (its local mirror for a gs:// one), or a
  folder of the cache named by the signature's digest."""
  remote = remote_splits.remote_folder(data_config, split)
  if remote:
    return remote_splits.mirror_folder(data_config, remote)
  if data_config.prepared_dir:
    return pathlib.Path(os.path.expanduser(data_config.prepared_dir)) / split
  digest = hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:20]
  return cache.cache_root(data_config.cache_dir) / 'prepared' / f'{split}-{digest}'


def workers_of(data_config: DataConfig) -> int:
  """config.data.prepare_workers, 0 meaning all cores."""
  return data_config.prepare_workers or os.cpu_count() or 1


@contextlib.contextmanager
def preparing(folder: pathlib.Path, part_index: int, part_count: int) -> Iterator[None]:
  """Holds the part's lock file unless its manifest is complete already.

  Two runs sharing a cache (a sweep's runs, a test's reference and sharded
  runs) may reach an unprepared part at once: the second waits for the first,
  then finds the part complete. A complete part needs no lock, so a read-only
  prepared folder still reads.
  """
  manifest = shards.read_manifest(folder / shards.manifest_name(part_index, part_count))
  if manifest is not None and manifest.get('complete'):
    yield
    return
  folder.mkdir(parents=True, exist_ok=True)
  lock_path = folder / shards.manifest_name(part_index, part_count).replace('.json', '.lock')
  with open(lock_path, 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield


def prepared_split(
    data_config: DataConfig,
    split: str,
    *,
    tokenizer: tokenizer_lib.Tokenizer,
    seq_len: int,
    prepare: bool = True,
    part_index: int = 0,
    part_count: int = 1,
) -> shards.PreparedSplit:
  """The split's prepared shards; with `prepare`, prepares part
  `part_index` of `part_count` first when its manifest is not complete."""
  signature = split_signature(data_config, split, tokenizer, seq_len)
  folder = split_folder(data_config, split, signature)
  remote = remote_splits.remote_folder(data_config, split)
  if remote:
    remote_splits.download(remote, folder)
  if prepare:
    with preparing(folder, part_index, part_count):
      prepare_part(
          data_config,
          split,
          folder,
          tokenizer=tokenizer,
          seq_len=seq_len,
          signature=signature,
          workers=workers_of(data_config),
          sequences_per_shard=data_config.sequences_per_shard,
          part_index=part_index,
          part_count=part_count,
      )
    if remote:
      remote_splits.upload(folder, remote)
  return shards.PreparedSplit(folder, signature)
