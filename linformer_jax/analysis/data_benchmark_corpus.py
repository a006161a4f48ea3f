"""The data benchmark's corpus: text files of a chosen size, written from a seed, with
the config overrides that read them."""

import json
import pathlib
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from linformer_jax.data import shards
from linformer_jax.data.sources import embedded
from linformer_jax.units import MIB

# A training text file ends with the first document that takes it past this size.
FILE_BYTES = MIB
VALIDATION_FILE = 'validation.txt'
CORPUS_MANIFEST = 'corpus.json'


def generate_corpus(
    folder: pathlib.Path,
    size_mb: int,
    seed: int = 0,
    documents: Optional[Tuple[Sequence[str], Sequence[str]]] = None,
) -> Dict[str, Any]:
  """Writes (or reuses) a corpus of about `size_mb` MiB of training text in `folder`.

  Training files train-NNNNN.txt hold whole documents separated by blank lines, in the order
  of a permutation seeded by (seed, file index), about FILE_BYTES each; validation.txt holds
  the validation documents once. `documents` are (train, validation) lists, default the
  embedded corpus's; only they are held in memory, whatever the size. A folder whose manifest
  matches is reused as it is. Returns the manifest, also written to folder/corpus.json.
  """
  manifest_path = folder / CORPUS_MANIFEST
  wanted = {'size_mb': size_mb, 'seed': seed, 'file_bytes': FILE_BYTES}
  if manifest_path.exists():
    manifest = json.loads(manifest_path.read_text())
    if all(manifest.get(key) == value for key, value in wanted.items()):
      return manifest
  train, validation = documents or tuple(map(embedded.embedded_documents, ('train', 'validation')))
  encoded = [text.encode('utf-8') for text in train]
  if not encoded or not validation:
    raise ValueError('generate_corpus needs training and validation documents.')
  folder.mkdir(parents=True, exist_ok=True)
  manifest_path.unlink(missing_ok=True)
  for stale in folder.glob('*.txt'):
    stale.unlink()
  train_files, remaining = 0, size_mb * MIB
  while remaining > 0:
    order = np.random.default_rng([seed, train_files]).permutation(len(encoded))
    chosen, size, target = [], 0, min(FILE_BYTES, remaining)
    while size < target:  # a file larger than all documents repeats them
      for index in order:
        chosen.append(encoded[index])
        size += len(encoded[index]) + 2
        if size >= target:
          break
    (folder / f'train-{train_files:05d}.txt').write_bytes(b'\n\n'.join(chosen) + b'\n')
    train_files, remaining = train_files + 1, remaining - size
  (folder / VALIDATION_FILE).write_text('\n\n'.join(validation) + '\n', 'utf-8')
  validation_bytes = (folder / VALIDATION_FILE).stat().st_size
  manifest = {
      **wanted,
      'train_files': train_files,
      'train_bytes': sum(path.stat().st_size for path in folder.glob('*.txt')) - validation_bytes,
      'validation_bytes': validation_bytes,
  }
  shards.write_json_atomically(manifest_path, manifest)  # last: marks the corpus complete
  return manifest


def corpus_overrides(folder: str, seq_len: int) -> Dict[str, Any]:
  """Config overrides that read a generated corpus in sequences of seq_len."""
  return {
      'data.source': 'text_files',
      'data.path': str(folder),
      'data.split_files': {'validation': [VALIDATION_FILE]},
      'data.train_split': 'train',
      'data.eval_split': 'validation',
      'model.max_len': seq_len,
  }
