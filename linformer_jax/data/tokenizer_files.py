"""A run's tokenizer in its workdir: loaded, copied from a pretrained run or trained.

WORKDIR/tokenizer.model (SentencePiece) or WORKDIR/tokenizer.json (Hugging
Face) is loaded when it exists, so token ids never change within a run; a new
one is staged next to it and kept only once the block that uses it succeeds.
A gs:// workdir's tokenizer is read through a local mirror in the data cache.
The tokenizers themselves are `linformer_jax.data.tokenizer`'s.
"""

import contextlib
import hashlib
import os
import pathlib
import shutil
from typing import Callable, Iterable, Iterator, Optional

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.data import cache
from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.tokenizer import FILENAMES
from linformer_jax.data.tokenizer import TOKENIZERS
from linformer_jax.data.tokenizer import ByteTokenizer
from linformer_jax.data.tokenizer import SentencePieceTokenizer
from linformer_jax.data.tokenizer import Tokenizer
from linformer_jax.data.tokenizer import load_file
from linformer_jax.data.tokenizer import training_sentences
from linformer_jax.errors import ConfigError


def vocab_size_of(data_config: DataConfig) -> int:
  """The vocabulary size of the tokenizer `workdir_tokenizer` gives, known
  before it is trained: a SentencePiece model or a tokenizer.json has exactly
  config.data.vocab_size tokens (loading or training one checks it)."""
  if data_config.tokenizer == 'byte':
    return ByteTokenizer.vocab_size
  return data_config.vocab_size


def _load_checked(kind: str, model_path: pathlib.Path, vocab_size: int, advice: str) -> Tokenizer:
  """The tokenizer file a run keeps, loaded, its vocabulary config.data's.

  Raises:
    ConfigError: the file is no tokenizer of `kind` (damaged: SentencePiece
      and the tokenizers library raise their own errors, of several types),
      or its vocabulary is another size.
  """
  try:
    tokenizer = load_file(kind, str(model_path))
  except Exception as error:  # pylint: disable=broad-exception-caught
    words = str(error).strip().splitlines()
    raise ConfigError(
        f'{model_path} cannot be read as a {kind} tokenizer '
        f"({words[0] if words else type(error).__name__}); it is the run's own tokenizer: "
        f'put back an intact copy of it, or {advice}.'
    ) from None
  if tokenizer.vocab_size != vocab_size:
    raise ConfigError(
        f'config.data.vocab_size={vocab_size} differs from the vocabulary of '
        f'{model_path} ({tokenizer.vocab_size}); set config.data.vocab_size='
        f'{tokenizer.vocab_size} or {advice} (if the run trained with {vocab_size}, the file '
        'was changed or cut short since: put back an intact copy).'
    )
  return tokenizer


def _local_tokenizer_file(data_config: DataConfig, workdir: str, kind: str) -> pathlib.Path:
  """The tokenizer file of `kind` in `workdir`, or for a gs:// workdir in its
  local mirror in the data cache, which holds a copy of the workdir's
  tokenizer file if it has one.

  SentencePiece and the tokenizers library read local files only; the
  tokenizer trained for a gs:// run is uploaded once kept.
  """
  if not storage.is_object_store(workdir):
    return pathlib.Path(run_folder.RunFolder(workdir).tokenizer(kind))
  digest = hashlib.sha256(workdir.encode()).hexdigest()[:20]
  mirror = cache.cache_root(data_config.cache_dir) / 'workdirs' / digest
  local = pathlib.Path(run_folder.RunFolder(str(mirror)).tokenizer(kind))
  remote = run_folder.RunFolder(workdir).tokenizer(kind)
  if storage.exists(remote):
    mirror.mkdir(parents=True, exist_ok=True)
    storage.copy_file(remote, str(local))
  return local


def run_tokenizer(data_config: DataConfig, workdir: str) -> Tokenizer:
  """The tokenizer a finished run was trained with: bytes, or its
  WORKDIR/tokenizer.model or tokenizer.json (never trained here)."""
  kind = data_config.tokenizer
  if kind == 'byte':
    return ByteTokenizer()
  if kind not in FILENAMES:
    raise ConfigError(
        f'config.data.tokenizer={kind!r} has no text to encode; use one of {TOKENIZERS}.'
    )
  model_path = _local_tokenizer_file(data_config, workdir, kind)
  if not model_path.exists():
    raise ConfigError(f'{workdir} has no {FILENAMES[kind]}; point --workdir at a trained run.')
  return _load_checked(kind, model_path, data_config.vocab_size, "use the run's own config")


@contextlib.contextmanager
def workdir_tokenizer(
    data_config: DataConfig,
    workdir: str,
    train_documents_fn: Callable[[], Iterable[str]],
    *,
    pretrained_model: Optional[str] = None,
) -> Iterator[Tokenizer]:
  """The tokenizer `config.data.tokenizer` names, for the body of a `with`.

  WORKDIR/tokenizer.model (or tokenizer.json) is loaded when it exists, so
  token ids never change within a run. Otherwise a new one (a copy of
  `pretrained_model`, or a SentencePiece model trained on
  `train_documents_fn()`) is staged under a temporary name next to it and
  renamed into place only when the block ends without an error: a run that
  fails on its data leaves no tokenizer that a later run, maybe on other data,
  would reuse. (Training is seeded, so a run killed before the rename trains
  the same model again.) A command refused later, after the block, removes
  the kept model again (`storage.undone_if_refused`: a training run refused
  before it starts, a reader whose checkpoint needs another tokenizer). A
  tokenizer.json is never trained: it comes with an imported checkpoint
  (`linformer_jax.import_checkpoint`).

  Args:
    data_config: `config.data`; reads `tokenizer` and `vocab_size`.
    workdir: the run's directory; created (with its missing parents) for the
      staged model, and removed again (when empty) if the block fails.
    train_documents_fn: returns the training documents; only called to train.
    pretrained_model: a tokenizer file of the configured kind to copy instead
      of training one.

  Yields:
    The tokenizer; a staged model's `model_path` moves to WORKDIR/FILENAME on
    success.
  """
  kind = data_config.tokenizer
  if kind == 'byte':
    yield ByteTokenizer()
    return
  if kind not in FILENAMES:
    raise ConfigError(f'config.data.tokenizer={kind!r} is not allowed; use one of {TOKENIZERS}.')
  vocab_size = data_config.vocab_size
  if not isinstance(vocab_size, int) or vocab_size < 8:
    raise ConfigError(
        f'config.data.vocab_size={vocab_size!r} is not allowed; use an int >= 8 (e.g. 8000).'
    )
  remote = workdir if storage.is_object_store(workdir) else None
  model_path = _local_tokenizer_file(data_config, workdir, kind)
  if model_path.exists():
    yield _load_checked(kind, model_path, vocab_size, 'use a new workdir')
    return
  if kind == 'huggingface' and not pretrained_model:
    raise ConfigError(
        f"config.data.tokenizer='huggingface' reads {model_path}, which does not exist; import "
        'a checkpoint there (python -m linformer_jax.import_checkpoint), or set '
        'config.init_from to a run that has one.'
    )
  # Before the training (minutes on a real corpus) rather than after it; a
  # gs:// run trains in its mirror in the data cache, checked with the cache.
  if not remote:
    storage.check_folder(workdir)
  staged = model_path.with_name(f'{model_path.name}.staged{os.getpid()}')
  # The folders made for it and the kept model are noted: a command refused
  # after this block (`storage.undone_if_refused`) removes them again.
  with storage.undone_if_refused():
    storage.makedirs(str(model_path.parent))
    try:
      if pretrained_model:
        tokenizer = _load_checked(
            kind,
            pathlib.Path(pretrained_model),
            vocab_size,
            'fine-tune from a run of that vocabulary',
        )
        shutil.copyfile(pretrained_model, staged)
        tokenizer.model_path = str(staged)
      else:
        tokenizer = SentencePieceTokenizer.train(
            training_sentences(train_documents_fn()), vocab_size, str(staged)
        )
      yield tokenizer
    except BaseException:
      staged.unlink(missing_ok=True)
      raise
    os.replace(staged, model_path)
    storage.note_created(str(model_path))
    tokenizer.model_path = str(model_path)
    tokenizer.made_now = True
    if remote:
      uploaded = run_folder.RunFolder(remote).tokenizer(kind)
      storage.copy_file(str(model_path), uploaded)
      storage.note_created(uploaded)


def build_tokenizer(
    data_config: DataConfig, workdir: str, train_documents_fn: Callable[[], Iterable[str]]
) -> Tokenizer:
  """`workdir_tokenizer` with nothing to check before a new model is kept.

  Args:
    data_config: `config.data`; reads `tokenizer` and `vocab_size`.
    workdir: the run's directory.
    train_documents_fn: returns the training documents; only called to train.
  """
  with workdir_tokenizer(data_config, workdir, train_documents_fn) as tokenizer:
    return tokenizer
