"""A run's tokenizer as the files of a Hugging Face folder: `tokenizer.json`
and `tokenizer_config.json`, which `AutoTokenizer.from_pretrained(DIR)` reads
into the run's own token ids.

* A Hugging Face tokenizer (an imported checkpoint's) is copied as it is.
* The byte tokenizer becomes a BPE model with no merges whose vocabulary is
  its four special tokens and the 256 byte tokens `<0x00>` .. `<0xFF>` (ids 4
  .. 259): every character falls back to its UTF-8 bytes.
* A SentencePiece model becomes the same unigram model in the `tokenizers`
  library: its pieces and scores, its normalisation (the model's precompiled
  character map, extra spaces removed), spaces as '▁' with one in front.

Both built tokenizers add the run's own framing: `[bos] text [eos]`, and for
a pair `[bos] first SEP second [eos]` with the tokenizer's separator, segment
0 up to the first separator token and 1 after (`data.encoding`); a causal
model's prompt is `[bos] text`, as the run's generation frames it. A special
token written in the text (say '<mask>') is read as that token, where the
run's tokenizer reads its characters: fill-mask needs it so.
"""

import json
import pathlib
from typing import Dict, List, Optional, Tuple

from sentencepiece import sentencepiece_model_pb2
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import processors

from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

# The byte tokenizer's special tokens, in id order (`ByteTokenizer`'s ids 0-3).
BYTE_SPECIAL_TOKENS = ('<pad>', '<s>', '</s>', '<mask>')
# SentencePiece's spaces and its piece types (sentencepiece_model.proto).
SPACE = '▁'
UNIGRAM = 1
SPECIAL_PIECE_TYPES = (2, 3, 4)  # UNKNOWN, CONTROL, USER_DEFINED
# tokenizer_config.json's names of the special tokens, and the roles they take.
ROLES = (
    ('bos_token', 'bos_id'),
    ('eos_token', 'eos_id'),
    ('cls_token', 'bos_id'),
    ('sep_token', 'eos_id'),
    ('pad_token', 'pad_id'),
    ('mask_token', 'mask_id'),
    ('unk_token', 'unk_id'),
)


def _byte_tokenizer() -> tokenizers.Tokenizer:
  vocabulary = {token: i for i, token in enumerate(BYTE_SPECIAL_TOKENS)}
  offset = len(BYTE_SPECIAL_TOKENS)
  vocabulary.update({f'<0x{byte:02X}>': offset + byte for byte in range(256)})
  tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocabulary, merges=[], byte_fallback=True))
  tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
  return tokenizer


def _sentencepiece_tokenizer(model_path: str) -> Tuple[tokenizers.Tokenizer, List[str]]:
  """The unigram model of a SentencePiece file, and its special pieces."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(pathlib.Path(model_path).read_bytes())
  if proto.trainer_spec.model_type != UNIGRAM:
    raise ConfigError(
        f'{model_path} is a SentencePiece model of type {proto.trainer_spec.model_type}; the '
        'export converts unigram models (the type this project trains).'
    )
  spec = proto.normalizer_spec
  tokenizer = tokenizers.Tokenizer(
      models.Unigram(
          [(piece.piece, piece.score) for piece in proto.pieces],
          unk_id=proto.trainer_spec.unk_id,
          byte_fallback=proto.trainer_spec.byte_fallback,
      )
  )
  steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
  if spec.remove_extra_whitespaces:
    steps += [normalizers.Replace(tokenizers.Regex(' {2,}'), ' '), normalizers.Strip()]
  if steps:
    tokenizer.normalizer = normalizers.Sequence(steps)
  prepend = 'always' if spec.add_dummy_prefix else 'never'
  split = proto.trainer_spec.split_by_whitespace
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(SPACE, prepend_scheme=prepend, split=split)
  metaspace = decoders.Metaspace(SPACE, prepend_scheme=prepend, split=split)
  if proto.trainer_spec.byte_fallback:
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), metaspace])
  else:
    tokenizer.decoder = metaspace
  special = [piece.piece for piece in proto.pieces if piece.type in SPECIAL_PIECE_TYPES]
  return tokenizer, special


def _framed(
    tokenizer: tokenizers.Tokenizer,
    run_tokenizer: tokenizer_lib.Tokenizer,
    special: List[str],
    causal: bool,
) -> tokenizers.Tokenizer:
  """`tokenizer` with its special tokens and the run's framing of texts and
  pairs; a causal model's prompt is `[bos] text`, as the run's generation
  frames it."""
  tokenizer.add_special_tokens(
      [tokenizers.AddedToken(token, special=True, normalized=False) for token in special]
  )
  token = tokenizer.id_to_token
  bos, eos = token(run_tokenizer.bos_id), token(run_tokenizer.eos_id)
  first, *rest = [token(i) for i in run_tokenizer.pair_separator]
  separator = ' '.join([f'{first}:0'] + [f'{piece}:1' for piece in rest])
  framing = (run_tokenizer.bos_id, run_tokenizer.eos_id) + tuple(run_tokenizer.pair_separator)
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f'{bos} $A' if causal else f'{bos} $A {eos}',
      pair=f'{bos}:0 $A:0 {separator} $B:1 {eos}:1',
      special_tokens=sorted({(token(i), i) for i in framing}),
  )
  return tokenizer


def huggingface_tokenizer(
    run_tokenizer: tokenizer_lib.Tokenizer, causal: bool = False
) -> Tuple[str, str]:
  """(the text of tokenizer.json, what it was) for a run's tokenizer; see
  `_framed` for `causal`.

  Raises:
    ConfigError: a tokenizer of another kind, or a SentencePiece model that
      is not unigram.
  """
  if isinstance(run_tokenizer, tokenizer_lib.HuggingFaceTokenizer):
    return pathlib.Path(run_tokenizer.model_path).read_text(), 'huggingface (copied)'
  if isinstance(run_tokenizer, tokenizer_lib.ByteTokenizer):
    converted = _framed(_byte_tokenizer(), run_tokenizer, list(BYTE_SPECIAL_TOKENS), causal)
    return converted.to_str(), 'byte (as BPE with byte fallback)'
  if isinstance(run_tokenizer, tokenizer_lib.SentencePieceTokenizer):
    unigram, special = _sentencepiece_tokenizer(run_tokenizer.model_path)
    return _framed(unigram, run_tokenizer, special, causal).to_str(), 'sentencepiece (as unigram)'
  raise ConfigError(
      f"The run's tokenizer {run_tokenizer!r} has no Hugging Face form; the export converts "
      f'the tokenizers {tokenizer_lib.TOKENIZERS}.'
  )


def tokenizer_files(
    run_tokenizer: tokenizer_lib.Tokenizer, *, max_len: int, with_segments: bool, causal: bool
) -> Tuple[Dict[str, str], str]:
  """The files of the run's tokenizer, name -> text, and what it was.

  Args:
    run_tokenizer: the run's tokenizer.
    max_len: the model's longest input (model_max_length).
    with_segments: the model reads token_type_ids (num_segments >= 2).
    causal: a left-to-right model, whose prompts end without eos.
  """
  text, kind = huggingface_tokenizer(run_tokenizer, causal)
  converted = tokenizers.Tokenizer.from_str(text)
  settings = {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'model_max_length': max_len,
      'padding_side': 'right',
      'clean_up_tokenization_spaces': False,
      'model_input_names': ['input_ids', 'attention_mask']
      + (['token_type_ids'] if with_segments else []),
  }
  for name, role in ROLES:
    token_id: Optional[int] = getattr(run_tokenizer, role, None)
    if token_id is not None:
      settings[name] = converted.id_to_token(token_id)
  tokenizer_config = json.dumps(settings, indent=2, ensure_ascii=False) + '\n'
  return {
      hf_checkpoint.TOKENIZER_FILE: text,
      hf_checkpoint.TOKENIZER_CONFIG_FILE: tokenizer_config,
  }, kind
