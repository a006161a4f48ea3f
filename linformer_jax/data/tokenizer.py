"""Tokenizers: a trained SentencePiece model, or raw UTF-8 bytes.

Both expose the ids the masked-LM pipeline needs: `pad_id` (0 in both), `bos_id`
(the first token of every sequence, RoBERTa's <s>, used as CLS), `eos_id`
(separator between documents and last token of a sequence, RoBERTa's </s>)
and `mask_id`. `special_ids` are never masked and never drawn as random
replacements.
"""

import abc
import contextlib
import hashlib
import io
import os
import pathlib
import shutil
from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import sentencepiece as spm

from linformer_jax.errors import ConfigError

TOKENIZERS = ('sentencepiece', 'byte')
MODEL_FILENAME = 'tokenizer.model'
MASK_PIECE = '<mask>'
# Sentences SentencePiece samples for training: enough for a stable vocabulary,
# few enough that training takes seconds.
TRAINING_SENTENCES = 300_000
# SentencePiece drops longer input lines; paragraphs longer than this are split.
_MAX_SENTENCE_CHARS = 4000
_TRAINING_SEED = 0


class Tokenizer(abc.ABC):
  """Maps text to token ids and back."""

  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int
  mask_id: int
  # sha256 (hex) of the model file's bytes; None for a tokenizer without one.
  sha256: Optional[str] = None

  @abc.abstractmethod
  def encode(self, text: str) -> List[int]:
    """Token ids of `text`, without bos/eos."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`; special tokens are dropped."""

  def encode_all(self, texts: Sequence[str]) -> List[List[int]]:
    """Token ids of many texts (faster than `encode` one by one where possible)."""
    return [self.encode(text) for text in texts]

  @property
  def special_ids(self) -> Tuple[int, ...]:
    """Ids that are not text: never masked nor used as random replacements."""
    return tuple(sorted({self.pad_id, self.bos_id, self.eos_id, self.mask_id}))

  @property
  def fingerprint(self) -> str:
    """Identifies the token mapping, e.g. to key caches of tokenized data."""
    return repr(self)


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes: byte b is id b + 4 after pad, bos, eos and mask (ids 0-3)."""

  pad_id, bos_id, eos_id, mask_id = 0, 1, 2, 3
  _OFFSET = 4
  vocab_size = 256 + _OFFSET

  def encode(self, text: str) -> List[int]:
    return (np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32) + self._OFFSET).tolist()

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(i - self._OFFSET for i in ids if i >= self._OFFSET)
    return data.decode('utf-8', errors='replace')

  def __repr__(self) -> str:
    return 'ByteTokenizer()'


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model: pad 0, unk 1, bos 2, eos 3, <mask> 4."""

  def __init__(self, model_path: str, threads: Optional[int] = None):
    """Loads a model; `encode_all` uses `threads` (default: all cores)."""
    self.model_path = str(model_path)
    self._threads = threads or os.cpu_count() or 1
    model_bytes = pathlib.Path(model_path).read_bytes()
    self._processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    self.sha256 = hashlib.sha256(model_bytes).hexdigest()
    self.vocab_size = self._processor.get_piece_size()
    self.pad_id = self._processor.pad_id()
    self.unk_id = self._processor.unk_id()
    self.bos_id = self._processor.bos_id()
    self.eos_id = self._processor.eos_id()
    self.mask_id = self._processor.piece_to_id(MASK_PIECE)
    if self.mask_id == self.unk_id:
      raise ConfigError(
          f'{model_path} has no {MASK_PIECE} piece; delete it so that '
          'a new tokenizer is trained.'
      )

  @property
  def special_ids(self) -> Tuple[int, ...]:
    # <unk> stands for text the vocabulary lacks; predicting it teaches nothing.
    return tuple(sorted(set(super().special_ids) | {self.unk_id}))

  def encode(self, text: str) -> List[int]:
    return self._processor.encode(text)

  def encode_all(self, texts: Sequence[str]) -> List[List[int]]:
    return self._processor.encode(list(texts), num_threads=self._threads)

  def decode(self, ids: Iterable[int]) -> str:
    return self._processor.decode([int(i) for i in ids])

  def __repr__(self) -> str:
    return f'SentencePieceTokenizer(vocab_size={self.vocab_size}, sha={self.sha256[:16]})'

  @classmethod
  def train(
      cls, sentences: Iterator[str], vocab_size: int, model_path: str
  ) -> 'SentencePieceTokenizer':
    """Trains a unigram model on `sentences` and saves it at `model_path`."""
    model = io.BytesIO()
    spm.SetRandomGeneratorSeed(_TRAINING_SEED)  # the sentence sample is seeded
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=sentences,
          model_writer=model,
          model_type='unigram',
          vocab_size=vocab_size,
          user_defined_symbols=[MASK_PIECE],
          pad_id=0,
          unk_id=1,
          bos_id=2,
          eos_id=3,
          input_sentence_size=TRAINING_SENTENCES,
          shuffle_input_sentence=True,
          max_sentence_length=4 * _MAX_SENTENCE_CHARS,  # in bytes
          num_threads=os.cpu_count() or 1,
          minloglevel=2,
      )
    except RuntimeError as error:
      # Raised e.g. when the corpus has fewer distinct pieces than vocab_size.
      raise ConfigError(
          f'SentencePiece training failed with config.data.vocab_size='
          f'{vocab_size}: {error}. Lower config.data.vocab_size or use '
          'a larger training split.'
      ) from error
    path = pathlib.Path(model_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f'{path.name}.tmp{os.getpid()}')
    temporary.write_bytes(model.getvalue())
    os.replace(temporary, path)  # a crash never leaves half a model to reuse
    return cls(str(path))


def training_sentences(documents: Iterable[str]) -> Iterator[str]:
  """Lines of the documents, long ones cut at spaces, for SentencePiece."""
  for document in documents:
    for line in document.splitlines():
      line = line.strip()
      while len(line) > _MAX_SENTENCE_CHARS:
        cut = line.rfind(' ', 0, _MAX_SENTENCE_CHARS)
        cut = cut if cut > 0 else _MAX_SENTENCE_CHARS
        yield line[:cut]
        line = line[cut:].lstrip()
      if line:
        yield line


def vocab_size_of(data_config: Mapping[str, Any]) -> int:
  """The vocabulary size of the tokenizer `workdir_tokenizer` gives, known
  before it is trained: a SentencePiece model has exactly
  config.data.vocab_size pieces (loading or training one checks it)."""
  if data_config['tokenizer'] == 'byte':
    return ByteTokenizer.vocab_size
  return data_config['vocab_size']


def _load_checked(model_path: pathlib.Path, vocab_size: int, advice: str) -> SentencePieceTokenizer:
  tokenizer = SentencePieceTokenizer(str(model_path))
  if tokenizer.vocab_size != vocab_size:
    raise ConfigError(
        f'config.data.vocab_size={vocab_size} differs from the vocabulary of '
        f'{model_path} ({tokenizer.vocab_size}); set config.data.vocab_size='
        f'{tokenizer.vocab_size} or {advice}.'
    )
  return tokenizer


def run_tokenizer(data_config: Mapping[str, Any], workdir: str) -> Tokenizer:
  """The tokenizer a finished run was trained with: bytes, or its
  WORKDIR/tokenizer.model (never trained here)."""
  kind = data_config['tokenizer']
  if kind == 'byte':
    return ByteTokenizer()
  if kind != 'sentencepiece':
    raise ConfigError(
        f"config.data.tokenizer={kind!r} has no text to encode; use 'sentencepiece' or 'byte'."
    )
  model_path = pathlib.Path(workdir) / MODEL_FILENAME
  if not model_path.exists():
    raise ConfigError(f'{workdir} has no {MODEL_FILENAME}; point --workdir at a trained run.')
  return _load_checked(model_path, data_config['vocab_size'], "use the run's own config")


@contextlib.contextmanager
def workdir_tokenizer(
    data_config: Mapping[str, Any],
    workdir: str,
    train_documents_fn: Callable[[], Iterable[str]],
    *,
    pretrained_model: Optional[str] = None,
) -> Iterator[Tokenizer]:
  """The tokenizer `config.data.tokenizer` names, for the body of a `with`.

  WORKDIR/tokenizer.model is loaded when it exists, so token ids never change
  within a run. Otherwise a new SentencePiece model (a copy of
  `pretrained_model`, or one trained on `train_documents_fn()`) is staged under
  a temporary name next to it and renamed to tokenizer.model only when the
  block ends without an error: a run that fails on its data leaves no
  tokenizer that a later run, maybe on other data, would reuse. (Training is
  seeded, so a run killed before the rename trains the same model again.)

  Args:
    data_config: `config.data`; reads `tokenizer` and `vocab_size`.
    workdir: the run's directory; created for the staged model if missing, and
      removed again (when empty) if the block fails.
    train_documents_fn: returns the training documents; only called to train.
    pretrained_model: a tokenizer.model to copy instead of training one.

  Yields:
    The tokenizer; a staged model's `model_path` moves to WORKDIR/tokenizer.model
    on success.
  """
  kind = data_config['tokenizer']
  if kind == 'byte':
    yield ByteTokenizer()
    return
  if kind != 'sentencepiece':
    raise ConfigError(f'config.data.tokenizer={kind!r} is not allowed; use one of {TOKENIZERS}.')
  vocab_size = data_config['vocab_size']
  if not isinstance(vocab_size, int) or vocab_size < 8:
    raise ConfigError(
        f'config.data.vocab_size={vocab_size!r} is not allowed; use an int >= 8 (e.g. 8000).'
    )
  model_path = pathlib.Path(workdir) / MODEL_FILENAME
  if model_path.exists():
    yield _load_checked(model_path, vocab_size, 'use a new workdir')
    return
  created = not model_path.parent.exists()
  staged = model_path.with_name(f'{MODEL_FILENAME}.staged{os.getpid()}')
  try:
    if pretrained_model:
      tokenizer = _load_checked(
          pathlib.Path(pretrained_model), vocab_size, 'fine-tune from a run of that vocabulary'
      )
      staged.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(pretrained_model, staged)
      tokenizer.model_path = str(staged)
    else:
      tokenizer = SentencePieceTokenizer.train(
          training_sentences(train_documents_fn()), vocab_size, str(staged)
      )
    yield tokenizer
  except BaseException:
    staged.unlink(missing_ok=True)
    if created and model_path.parent.is_dir() and not any(model_path.parent.iterdir()):
      model_path.parent.rmdir()
    raise
  os.replace(staged, model_path)
  tokenizer.model_path = str(model_path)


def build_tokenizer(
    data_config: Mapping[str, Any], workdir: str, train_documents_fn: Callable[[], Iterable[str]]
) -> Tokenizer:
  """`workdir_tokenizer` with nothing to check before a new model is kept.

  Args:
    data_config: `config.data`; reads `tokenizer` and `vocab_size`.
    workdir: the run's directory.
    train_documents_fn: returns the training documents; only called to train.
  """
  with workdir_tokenizer(data_config, workdir, train_documents_fn) as tokenizer:
    return tokenizer
