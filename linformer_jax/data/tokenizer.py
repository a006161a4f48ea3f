"""Tokenizers: a trained SentencePiece model, raw UTF-8 bytes, or a Hugging Face
`tokenizer.json` (an imported checkpoint's own: byte-level BPE, WordPiece, ...).

All expose the ids the masked-LM pipeline needs: `pad_id`, `bos_id` (the first
token of every sequence, RoBERTa's <s>, BERT's [CLS]), `eos_id` (separator
between documents and last token of a sequence, RoBERTa's </s>, BERT's [SEP])
and `mask_id`. `special_ids` are never masked and never drawn as random
replacements. Nothing downstream assumes an id: each comes from the tokenizer.
The tokenizer a run keeps in its workdir is `linformer_jax.data.tokenizer_files`'s.
"""

import abc
import hashlib
import io
import os
import pathlib
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import sentencepiece as spm
import tokenizers

from linformer_jax import run_folder
from linformer_jax.errors import ConfigError

TOKENIZERS = ('sentencepiece', 'byte', 'huggingface')
# The file a run keeps its tokenizer in, per config.data.tokenizer (none for bytes).
FILENAMES = run_folder.TOKENIZER_FILES
# The tokens of RoBERTa's and BERT's vocabularies that play each role.
HUGGINGFACE_ROLES = {
    'pad_id': ('<pad>', '[PAD]'),
    'bos_id': ('<s>', '[CLS]'),
    'eos_id': ('</s>', '[SEP]'),
    'mask_id': ('<mask>', '[MASK]'),
    'unk_id': ('<unk>', '[UNK]'),
}
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
  # Whether this process made the run's file: trained, or copied from a
  # pretrained run, where the workdir had none (`tokenizer_files`).
  made_now: bool = False

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
  def pair_separator(self) -> Tuple[int, ...]:
    """The ids between the two texts of a pair: RoBERTa's </s></s>."""
    return (self.eos_id, self.eos_id)

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


class HuggingFaceTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json`, run by the `tokenizers` library.

  The roles come from the vocabulary's special tokens, RoBERTa's (<s>, </s>,
  <pad>, <mask>, <unk>) or BERT's ([CLS], [SEP], [PAD], [MASK], [UNK]); a
  file with neither of a role's tokens, or both as special tokens, is refused
  (<unk> may be missing: byte-level BPE needs none). The file's own special
  tokens are special here too. Pairs are separated as its
  post-processor separates them (RoBERTa </s></s>, BERT [SEP]).
  """

  def __init__(self, model_path: str):
    self.model_path = str(model_path)
    model_bytes = pathlib.Path(model_path).read_bytes()
    self.sha256 = hashlib.sha256(model_bytes).hexdigest()
    try:
      self._tokenizer = tokenizers.Tokenizer.from_str(model_bytes.decode('utf-8'))
    except Exception as error:  # pylint: disable=broad-except  # the library raises bare Exception
      raise ConfigError(
          f'{model_path} is not a tokenizer.json the tokenizers library can read ({error}).'
      ) from None
    self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
    added = self._tokenizer.get_added_tokens_decoder()
    self._own_special_ids = {i for i, token in added.items() if token.special}
    for role, candidates in HUGGINGFACE_ROLES.items():
      found = [t for t in candidates if self.token_id(t) is not None]
      if len(found) > 1:  # e.g. '[CLS]' as plain text in a RoBERTa vocabulary
        found = [t for t in found if self.token_id(t) in self._own_special_ids]
      if len(found) != 1 and role != 'unk_id':
        raise ConfigError(
            f'{model_path} must hold exactly one of the tokens {" or ".join(candidates)} '
            f'(found {len(found)}); it is not a RoBERTa or BERT tokenizer.'
        )
      setattr(self, role, self.token_id(found[0]) if len(found) == 1 else None)
    # A pair template adds bos, eos and the separator; without one, RoBERTa's.
    processor = self._tokenizer.post_processor
    separators = processor.num_special_tokens_to_add(True) - 2 if processor else 0
    self._pair_separator = (self.eos_id,) * (separators if separators > 0 else 2)

  @property
  def special_ids(self) -> Tuple[int, ...]:
    ids = set(super().special_ids) | self._own_special_ids
    return tuple(sorted(ids | ({self.unk_id} if self.unk_id is not None else set())))

  @property
  def pair_separator(self) -> Tuple[int, ...]:
    return self._pair_separator

  def token_id(self, token: str) -> Optional[int]:
    """The id of a token of the vocabulary, None if it has none."""
    return self._tokenizer.token_to_id(token)

  def encode(self, text: str) -> List[int]:
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_all(self, texts: Sequence[str]) -> List[List[int]]:
    return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  def __repr__(self) -> str:
    return f'HuggingFaceTokenizer(vocab_size={self.vocab_size}, sha={self.sha256[:16]})'


def load_file(kind: str, model_path: str, threads: Optional[int] = None) -> Tokenizer:
  """The tokenizer of kind `kind` ('sentencepiece' or 'huggingface') saved at
  `model_path`; `threads` for SentencePiece's `encode_all`."""
  if kind == 'huggingface':
    return HuggingFaceTokenizer(model_path)
  return SentencePieceTokenizer(model_path, threads=threads)


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
