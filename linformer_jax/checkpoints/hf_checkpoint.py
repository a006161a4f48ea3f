"""Hugging Face checkpoints read, checked and mapped onto this project's model:
RoBERTa, BERT, and the Linformer folders this project exports (`hf_export`).

A checkpoint folder in the Hugging Face layout holds `config.json`,
`model.safetensors` (or shards listed in `model.safetensors.index.json`) and
`tokenizer.json`. `read_folder` reads and checks it; `model_fields` gives the
`config.model` fields of its architecture; `hf_tensors.to_params` maps every
tensor onto the variables of `models.MaskedLanguageModel`. `ENCODER_FIELDS`
and `LINFORMER_FIELDS` name config.json's fields as config.model's, for the
import and the export alike.

RoBERTa and BERT are the post-LN encoder of `models.Encoder` with the
masked-LM head of `models.MaskedLanguageModel` (dense, exact GELU, layer norm,
the tied embedding as decoder, a bias). What differs is taken from config.json:

* the layer norms' epsilon (`layer_norm_epsilon`: RoBERTa 1e-5, BERT 1e-12);
* the token-type embedding (`num_segments` = type_vocab_size: BERT 2, whose row
  0 every masked-LM input gets; RoBERTa 1, added to every token; a RoBERTa
  row of zeros, as a run without segments exports, adds nothing: 0);
* RoBERTa's positions, which start at pad_token_id + 1: its table's rows from
  there on are this model's rows 0, 1, ... (the rows before serve only HF's
  padding positions, whose outputs no real token sees).

A Linformer folder (model_type 'linformer', `hf_remote/`) is this project's
model itself: its config.json holds every field the model needs (k per layer,
sharing, projection, pre-LN, ...) and its max_len, and its weights the E/F
projections; it is read when it is a masked LM (LinformerForMaskedLM).

Anything else is refused rather than approximated: another model_type, an
activation other than exact GELU, relative position embeddings, a decoder
that is not the embedding, cross-attention, a Linformer folder of another head.
"""

import dataclasses
import json
import pathlib
from typing import Any, Dict, Mapping, Optional

import numpy as np
import safetensors.numpy

from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
WEIGHTS_INDEX_FILE = 'model.safetensors.index.json'
TOKENIZER_FILE = 'tokenizer.json'
TOKENIZER_CONFIG_FILE = 'tokenizer_config.json'
ARCHITECTURES = ('roberta', 'bert', 'linformer')
# config.json's fields and the config.model fields they are, for every architecture.
ENCODER_FIELDS = (
    ('vocab_size', 'vocab_size'),
    ('num_hidden_layers', 'num_layers'),
    ('num_attention_heads', 'num_heads'),
    ('hidden_size', 'hidden_dim'),
    ('intermediate_size', 'mlp_dim'),
    ('type_vocab_size', 'num_segments'),
    ('layer_norm_eps', 'layer_norm_epsilon'),
)
# The dropout rates config.json gives, as config.model's; a RoBERTa or BERT
# folder leaves activation dropout out (0, its MLP has none).
DROPOUT_FIELDS = (
    ('hidden_dropout_prob', 'dropout_rate'),
    ('attention_probs_dropout_prob', 'attention_dropout_rate'),
)
HF_DEFAULT_DROPOUT = 0.1  # transformers' default for both
# A Linformer's own config.json fields, named as the config.model fields they
# are; its max_position_embeddings is config.model.max_len.
LINFORMER_FIELDS = (
    'attention',
    'projected_len',
    'sharing',
    'projection',
    'projection_init',
    'projection_init_noise',
    'causal',
    'block_len',
    'pre_layer_norm',
    'pooling',
)
# The Linformer head the import reads (a masked LM).
LINFORMER_MASKED_LM = 'LinformerForMaskedLM'
SEGMENT_TABLE = 'embeddings.token_type_embeddings.weight'
# tokenizer_config.json's names of the special tokens -> the tokenizer's roles.
TOKENIZER_CONFIG_ROLES = {
    'cls_token': 'bos_id',
    'sep_token': 'eos_id',
    'pad_token': 'pad_id',
    'mask_token': 'mask_id',
    'unk_token': 'unk_id',
}


@dataclasses.dataclass
class Checkpoint:
  """A read Hugging Face checkpoint folder.

  Attributes:
    folder: where it was read from.
    architecture: 'roberta' or 'bert'.
    config: config.json.
    tensors: every tensor of the weights file(s), by name (LayerNorm's old
      gamma/beta names read as weight/bias).
    tokenizer: its tokenizer.json.
  """

  folder: pathlib.Path
  architecture: str
  config: Dict[str, Any]
  tensors: Dict[str, np.ndarray]
  tokenizer: tokenizer_lib.HuggingFaceTokenizer

  @property
  def prefix(self) -> str:
    """The encoder's tensor-name prefix: 'roberta.', 'bert.', or '' (saved bare)."""
    prefix = f'{self.architecture}.'
    return prefix if f'{prefix}embeddings.word_embeddings.weight' in self.tensors else ''

  @property
  def zero_token_types(self) -> bool:
    """RoBERTa's one token-type row, all zeros: it adds nothing (an export of
    a run without segments writes it)."""
    table = self.tensors.get(self.prefix + SEGMENT_TABLE)
    return (
        self.architecture == 'roberta'
        and self.config['type_vocab_size'] == 1
        and table is not None
        and not np.any(table)
    )

  @property
  def position_offset(self) -> int:
    """The row of the position table that position 0 reads."""
    return self.config['pad_token_id'] + 1 if self.architecture == 'roberta' else 0

  @property
  def max_positions(self) -> int:
    """The longest sequence the position table serves."""
    return self.config['max_position_embeddings'] - self.position_offset


class FolderError(ConfigError):
  """A checkpoint folder that cannot be read: '--from=FOLDER: reason', one line.

  Attributes:
    reason: what is wrong with the folder and what to do, without the flag,
      for a caller that names the folder otherwise (`linformer_jax.load`).
  """

  def __init__(self, folder: pathlib.Path, reason: str):
    super().__init__(f'--from={folder}: {reason}')
    self.reason = reason


def fail(folder: pathlib.Path, message: str) -> FolderError:
  """The one-line error about a checkpoint folder: '--from=FOLDER: message'."""
  return FolderError(folder, message)


def is_checkpoint_folder(folder: str) -> bool:
  """Whether `folder` holds a Hugging Face checkpoint rather than a run: its
  config.json names a `model_type`, which a run's config never has. Whether
  it can be read is `read_folder`'s to say."""
  try:
    hf_fields = json.loads((pathlib.Path(folder) / CONFIG_FILE).read_text())
  except (OSError, ValueError):
    return False
  return isinstance(hf_fields, dict) and 'model_type' in hf_fields


def _read_json(folder: pathlib.Path, name: str) -> Dict[str, Any]:
  try:
    return json.loads((folder / name).read_text())
  except (OSError, ValueError) as error:
    raise fail(folder, f'cannot read {name} ({error}).') from None


def _check_config(folder: pathlib.Path, hf_fields: Mapping[str, Any]) -> str:
  """The architecture of config.json; ConfigError for one this import cannot map exactly."""
  architecture = hf_fields.get('model_type')
  if architecture not in ARCHITECTURES:
    raise fail(
        folder,
        f'unsupported architecture model_type={architecture!r} '
        f'({", ".join(hf_fields.get("architectures") or [])}); the import reads '
        f'model_type {" or ".join(ARCHITECTURES)}.',
    )
  architectures = hf_fields.get('architectures') or []
  if architecture == 'linformer' and architectures != [LINFORMER_MASKED_LM]:
    raise fail(
        folder,
        f'architectures={architectures}: the import reads a masked LM ({LINFORMER_MASKED_LM}); '
        'a classifier or causal LM folder cannot be imported.',
    )
  refusals = (
      (
          hf_fields.get('position_embedding_type', 'absolute') != 'absolute',
          f'position_embedding_type={hf_fields.get("position_embedding_type")!r}: only absolute '
          'learned positions are supported',
      ),
      (
          hf_fields.get('hidden_act', 'gelu') != 'gelu',
          f'hidden_act={hf_fields.get("hidden_act")!r}: only exact GELU (gelu) is supported',
      ),
      (
          not hf_fields.get('tie_word_embeddings', True),
          'tie_word_embeddings=false: the decoder must be the token embedding',
      ),
      (
          hf_fields.get('is_decoder') or hf_fields.get('add_cross_attention'),
          'is_decoder or add_cross_attention: a decoder is not the encoder this model has',
      ),
      (
          architecture == 'roberta' and not isinstance(hf_fields.get('pad_token_id'), int),
          "RoBERTa's positions start after pad_token_id, which config.json lacks",
      ),
  )
  for refused, why in refusals:
    if refused:
      raise fail(folder, f'unsupported architecture: {why}.')
  required = [theirs for theirs, _ in ENCODER_FIELDS] + ['max_position_embeddings']
  if architecture == 'linformer':
    required += LINFORMER_FIELDS
  for field in required:
    if field not in hf_fields:
      raise fail(folder, f'config.json has no {field}; it is not a {architecture} config.')
  return architecture


def _read_tensors(folder: pathlib.Path) -> Dict[str, np.ndarray]:
  if (folder / WEIGHTS_FILE).exists():
    files = [WEIGHTS_FILE]
  elif (folder / WEIGHTS_INDEX_FILE).exists():
    files = sorted(set(_read_json(folder, WEIGHTS_INDEX_FILE).get('weight_map', {}).values()))
  else:
    raise fail(
        folder,
        f'no {WEIGHTS_FILE}; save the model with safetensors (save_pretrained does by default).',
    )
  tensors = {}
  for name in files:
    try:
      tensors.update(safetensors.numpy.load_file(str(folder / name)))
    except (OSError, ValueError) as error:
      raise fail(folder, f'cannot read {name} ({error}).') from None
  renamed = {}
  for name, array in tensors.items():
    if name.endswith('LayerNorm.gamma'):
      name = name[: -len('gamma')] + 'weight'
    elif name.endswith('LayerNorm.beta'):
      name = name[: -len('beta')] + 'bias'
    renamed[name] = array
  return renamed


def _token_of(value: Any) -> Optional[str]:
  """A special token of tokenizer_config.json: a string or {'content': ...}."""
  return value.get('content') if isinstance(value, dict) else value


def _check_tokenizer(
    folder: pathlib.Path,
    tokenizer: tokenizer_lib.HuggingFaceTokenizer,
    hf_fields: Mapping[str, Any],
) -> None:
  """ConfigError unless the tokenizer fits the model and its own tokenizer_config.json."""
  if tokenizer.vocab_size != hf_fields['vocab_size']:
    raise fail(
        folder,
        f'tokenizer.json has {tokenizer.vocab_size} tokens, config.json vocab_size='
        f'{hf_fields["vocab_size"]}; the tokenizer does not belong to these weights.',
    )
  if hf_fields.get('pad_token_id') is not None and hf_fields['pad_token_id'] != tokenizer.pad_id:
    raise fail(
        folder,
        f'config.json has pad_token_id={hf_fields["pad_token_id"]}, tokenizer.json pads with '
        f'{tokenizer.pad_id}; the tokenizer does not belong to these weights.',
    )
  if not (folder / TOKENIZER_CONFIG_FILE).exists():
    return
  settings = _read_json(folder, TOKENIZER_CONFIG_FILE)
  for key, role in TOKENIZER_CONFIG_ROLES.items():
    token = _token_of(settings.get(key))
    if token is not None and tokenizer.token_id(token) != getattr(tokenizer, role):
      raise fail(
          folder,
          f'{TOKENIZER_CONFIG_FILE} names {key}={token!r}, but the tokenizer gives that role '
          f'to id {getattr(tokenizer, role)}; a tokenizer of another layout is not supported.',
      )


def read_folder(folder: str) -> Checkpoint:
  """Reads and checks a Hugging Face checkpoint folder.

  Raises:
    ConfigError: a missing folder or file, an unsupported architecture, or a
      tokenizer that does not fit the weights; one line each.
  """
  path = pathlib.Path(folder)
  if not path.is_dir():
    raise fail(
        path,
        'no such folder; give a folder with config.json, model.safetensors and tokenizer.json.',
    )
  for name in (CONFIG_FILE, TOKENIZER_FILE):
    if not (path / name).exists():
      raise fail(path, f'the folder has no {name}.')
  config = _read_json(path, CONFIG_FILE)
  architecture = _check_config(path, config)
  tokenizer = tokenizer_lib.HuggingFaceTokenizer(str(path / TOKENIZER_FILE))
  _check_tokenizer(path, tokenizer, config)
  return Checkpoint(path, architecture, config, _read_tensors(path), tokenizer)


def model_fields(checkpoint: Checkpoint) -> Dict[str, Any]:
  """The `config.model` fields the checkpoint fixes: for RoBERTa and BERT all but
  max_len and the attention settings; for a Linformer every field of its
  model, max_len included."""
  config = checkpoint.config
  fields = {ours: config[theirs] for theirs, ours in ENCODER_FIELDS}
  fields['layer_norm_epsilon'] = float(fields['layer_norm_epsilon'])
  # Dropout as the checkpoint was trained with (transformers' defaults where unset).
  for theirs, ours in DROPOUT_FIELDS:
    fields[ours] = float(config[theirs]) if theirs in config else HF_DEFAULT_DROPOUT
  if checkpoint.architecture == 'linformer':
    fields.update({name: config[name] for name in LINFORMER_FIELDS})
    if 'activation_dropout' in config:
      fields['activation_dropout_rate'] = float(config['activation_dropout'])
    if isinstance(fields['projected_len'], list):
      fields['projected_len'] = tuple(fields['projected_len'])
    fields['max_len'] = config['max_position_embeddings']
    return fields
  if checkpoint.zero_token_types:
    fields['num_segments'] = 0
  fields.update(pre_layer_norm=False, causal=False)
  return fields
