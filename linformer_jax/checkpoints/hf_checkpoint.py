"""Hugging Face RoBERTa and BERT checkpoints, read and mapped onto this project's model.

A checkpoint folder in the Hugging Face layout holds `config.json`,
`model.safetensors` (or shards listed in `model.safetensors.index.json`) and
`tokenizer.json`. `read_folder` reads and checks it; `model_fields` gives the
`config.model` fields of its architecture; `to_params` maps every tensor onto
the parameters of `models.MaskedLanguageModel`.

Both architectures are the post-LN encoder of `models.Encoder` with the
masked-LM head of `models.MaskedLanguageModel` (dense, exact GELU, layer norm,
the tied embedding as decoder, a bias). What differs is taken from config.json:

* the layer norms' epsilon (`layer_norm_epsilon`: RoBERTa 1e-5, BERT 1e-12);
* the token-type embedding (`num_segments` = type_vocab_size: BERT 2, whose row
  0 every masked-LM input gets; RoBERTa 1, added to every token);
* RoBERTa's positions, which start at pad_token_id + 1: its table's rows from
  there on are this model's rows 0, 1, ... (the rows before serve only HF's
  padding positions, whose outputs no real token sees).

Anything else is refused rather than approximated: another model_type, an
activation other than exact GELU, relative position embeddings, a decoder
that is not the embedding, cross-attention.
"""

import dataclasses
import json
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import safetensors.numpy

from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
WEIGHTS_INDEX_FILE = 'model.safetensors.index.json'
TOKENIZER_CONFIG_FILE = 'tokenizer_config.json'
ARCHITECTURES = ('roberta', 'bert')
# tokenizer_config.json's names of the special tokens -> the tokenizer's roles.
TOKENIZER_CONFIG_ROLES = {
    'cls_token': 'bos_id',
    'sep_token': 'eos_id',
    'pad_token': 'pad_id',
    'mask_token': 'mask_id',
    'unk_token': 'unk_id',
}

# How a tensor's layout (torch's Linear is [out, in]) becomes a parameter's:
#   same       as it is
#   linear     [out, in] -> [in, out]
#   heads_in   [heads * head_dim, hidden] -> [hidden, heads, head_dim]
#   heads_bias [heads * head_dim] -> [heads, head_dim]
#   heads_out  [hidden, heads * head_dim] -> [heads, head_dim, hidden]
#   positions  rows offset .. offset + max_len - 1 of the position table
LAYOUTS = ('same', 'linear', 'heads_in', 'heads_bias', 'heads_out', 'positions')


# (checkpoint name after 'roberta.' or 'bert.', parameter path, layout).
EMBEDDING_TENSORS = (
    ('embeddings.word_embeddings.weight', ('encoder', 'token_embedding', 'embedding'), 'same'),
    ('embeddings.position_embeddings.weight', ('encoder', 'position_embedding'), 'positions'),
    ('embeddings.token_type_embeddings.weight', ('encoder', 'segment_embedding'), 'same'),
    ('embeddings.LayerNorm.weight', ('encoder', 'embedding_norm', 'scale'), 'same'),
    ('embeddings.LayerNorm.bias', ('encoder', 'embedding_norm', 'bias'), 'same'),
)
# (name after 'encoder.layer.I.', path after ('encoder', 'layers_I'), layout).
LAYER_TENSORS = tuple(
    (f'attention.self.{name}.{kind}', ('attention', name, param), layout)
    for name in ('query', 'key', 'value')
    for kind, param, layout in (('weight', 'kernel', 'heads_in'), ('bias', 'bias', 'heads_bias'))
) + (
    ('attention.output.dense.weight', ('attention', 'out', 'kernel'), 'heads_out'),
    ('attention.output.dense.bias', ('attention', 'out', 'bias'), 'same'),
    ('attention.output.LayerNorm.weight', ('attention_norm', 'scale'), 'same'),
    ('attention.output.LayerNorm.bias', ('attention_norm', 'bias'), 'same'),
    ('intermediate.dense.weight', ('mlp', 'wi', 'kernel'), 'linear'),
    ('intermediate.dense.bias', ('mlp', 'wi', 'bias'), 'same'),
    ('output.dense.weight', ('mlp', 'wo', 'kernel'), 'linear'),
    ('output.dense.bias', ('mlp', 'wo', 'bias'), 'same'),
    ('output.LayerNorm.weight', ('mlp_norm', 'scale'), 'same'),
    ('output.LayerNorm.bias', ('mlp_norm', 'bias'), 'same'),
)
# (key of `_head_names`, parameter path, layout).
HEAD_TENSORS = (
    ('dense.weight', ('mlm_dense', 'kernel'), 'linear'),
    ('dense.bias', ('mlm_dense', 'bias'), 'same'),
    ('norm.weight', ('mlm_norm', 'scale'), 'same'),
    ('norm.bias', ('mlm_norm', 'bias'), 'same'),
    ('bias', ('mlm_bias',), 'same'),
)


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One checkpoint tensor and the parameter it becomes."""

  name: str  # the tensor's name in the checkpoint
  path: Tuple[str, ...]  # the parameter's path in MaskedLanguageModel's params
  layout: str  # one of LAYOUTS


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
  def position_offset(self) -> int:
    """The row of the position table that position 0 reads."""
    return self.config['pad_token_id'] + 1 if self.architecture == 'roberta' else 0

  @property
  def max_positions(self) -> int:
    """The longest sequence the position table serves."""
    return self.config['max_position_embeddings'] - self.position_offset


def _fail(folder: pathlib.Path, message: str) -> ConfigError:
  return ConfigError(f'--from={folder}: {message}')


def _read_json(folder: pathlib.Path, name: str) -> Dict[str, Any]:
  try:
    return json.loads((folder / name).read_text())
  except (OSError, ValueError) as error:
    raise _fail(folder, f'cannot read {name} ({error}).') from None


def _check_config(folder: pathlib.Path, hf_fields: Mapping[str, Any]) -> str:
  """The architecture of config.json; ConfigError for one this import cannot map exactly."""
  architecture = hf_fields.get('model_type')
  if architecture not in ARCHITECTURES:
    raise _fail(
        folder,
        f'unsupported architecture model_type={architecture!r} '
        f'({", ".join(hf_fields.get("architectures") or [])}); the import reads '
        f'model_type {" or ".join(ARCHITECTURES)}.',
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
      raise _fail(folder, f'unsupported architecture: {why}.')
  for field in (
      'vocab_size',
      'hidden_size',
      'num_hidden_layers',
      'num_attention_heads',
      'intermediate_size',
      'max_position_embeddings',
      'type_vocab_size',
      'layer_norm_eps',
  ):
    if field not in hf_fields:
      raise _fail(folder, f'config.json has no {field}; it is not a {architecture} config.')
  return architecture


def _read_tensors(folder: pathlib.Path) -> Dict[str, np.ndarray]:
  if (folder / WEIGHTS_FILE).exists():
    files = [WEIGHTS_FILE]
  elif (folder / WEIGHTS_INDEX_FILE).exists():
    files = sorted(set(_read_json(folder, WEIGHTS_INDEX_FILE).get('weight_map', {}).values()))
  else:
    raise _fail(
        folder,
        f'no {WEIGHTS_FILE}; save the model with safetensors (save_pretrained does by default).',
    )
  tensors = {}
  for name in files:
    try:
      tensors.update(safetensors.numpy.load_file(str(folder / name)))
    except (OSError, ValueError) as error:
      raise _fail(folder, f'cannot read {name} ({error}).') from None
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
    raise _fail(
        folder,
        f'tokenizer.json has {tokenizer.vocab_size} tokens, config.json vocab_size='
        f'{hf_fields["vocab_size"]}; the tokenizer does not belong to these weights.',
    )
  if hf_fields.get('pad_token_id') is not None and hf_fields['pad_token_id'] != tokenizer.pad_id:
    raise _fail(
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
      raise _fail(
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
    raise _fail(
        path,
        'no such folder; give a folder with config.json, model.safetensors and tokenizer.json.',
    )
  for name in (CONFIG_FILE, tokenizer_lib.HUGGINGFACE_FILENAME):
    if not (path / name).exists():
      raise _fail(path, f'the folder has no {name}.')
  config = _read_json(path, CONFIG_FILE)
  architecture = _check_config(path, config)
  tokenizer = tokenizer_lib.HuggingFaceTokenizer(str(path / tokenizer_lib.HUGGINGFACE_FILENAME))
  _check_tokenizer(path, tokenizer, config)
  return Checkpoint(path, architecture, config, _read_tensors(path), tokenizer)


def model_fields(checkpoint: Checkpoint) -> Dict[str, Any]:
  """The `config.model` fields the checkpoint fixes (all but max_len and the
  attention settings)."""
  config = checkpoint.config
  return {
      'vocab_size': config['vocab_size'],
      'num_layers': config['num_hidden_layers'],
      'num_heads': config['num_attention_heads'],
      'hidden_dim': config['hidden_size'],
      'mlp_dim': config['intermediate_size'],
      'num_segments': config['type_vocab_size'],
      'layer_norm_epsilon': float(config['layer_norm_eps']),
      'pre_layer_norm': False,
      'causal': False,
  }


def tensor_map(checkpoint: Checkpoint) -> List[Tensor]:
  """Every checkpoint tensor the masked-LM model takes, and where it goes."""
  prefix, head = checkpoint.prefix, _head_names(checkpoint.architecture)
  tensors = [Tensor(prefix + name, path, layout) for name, path, layout in EMBEDDING_TENSORS]
  for i in range(checkpoint.config['num_hidden_layers']):
    tensors += [
        Tensor(f'{prefix}encoder.layer.{i}.{name}', ('encoder', f'layers_{i}') + path, layout)
        for name, path, layout in LAYER_TENSORS
    ]
  return tensors + [Tensor(head[name], path, layout) for name, path, layout in HEAD_TENSORS]


def _head_names(architecture: str) -> Dict[str, str]:
  """The masked-LM head's tensor names; 'decoder.*' are the tied copies."""
  if architecture == 'roberta':
    names = dict(dense='lm_head.dense', norm='lm_head.layer_norm', bias='lm_head.bias')
    names['decoder'] = 'lm_head.decoder'
  else:
    names = dict(
        dense='cls.predictions.transform.dense',
        norm='cls.predictions.transform.LayerNorm',
        bias='cls.predictions.bias',
        decoder='cls.predictions.decoder',
    )
  return {
      'dense.weight': f'{names["dense"]}.weight',
      'dense.bias': f'{names["dense"]}.bias',
      'norm.weight': f'{names["norm"]}.weight',
      'norm.bias': f'{names["norm"]}.bias',
      'bias': names['bias'],
      'decoder.weight': f'{names["decoder"]}.weight',
      'decoder.bias': f'{names["decoder"]}.bias',
  }


def unused_tensors(checkpoint: Checkpoint) -> List[str]:
  """Tensors a masked LM has no use for: BERT's pooler and next-sentence head,
  saved position-id buffers and the tied decoder's copies (checked equal).

  Raises:
    ConfigError: a tensor that is neither mapped nor one of these.
  """
  mapped = {tensor.name for tensor in tensor_map(checkpoint)}
  head = _head_names(checkpoint.architecture)
  tied = {head['decoder.weight'], head['decoder.bias']}
  unused, unknown = [], []
  for name in sorted(checkpoint.tensors):
    if name in mapped:
      continue
    if (
        name in tied
        or name.startswith((f'{checkpoint.prefix}pooler.', 'cls.seq_relationship.'))
        or name.endswith('position_ids')
    ):
      unused.append(name)
    else:
      unknown.append(name)
  if unknown:
    raise _fail(
        checkpoint.folder,
        f'unsupported architecture: {len(unknown)} tensor(s) this import cannot map, e.g. '
        f'{unknown[0]}.',
    )
  return unused


def _check_tied(checkpoint: Checkpoint) -> None:
  """ConfigError if the saved decoder differs from the embedding and its bias."""
  head, tensors = _head_names(checkpoint.architecture), checkpoint.tensors
  pairs = (
      (head['decoder.weight'], f'{checkpoint.prefix}embeddings.word_embeddings.weight'),
      (head['decoder.bias'], head['bias']),
  )
  for copy, original in pairs:
    if (
        copy in tensors
        and original in tensors
        and not np.array_equal(tensors[copy], tensors[original])
    ):
      raise _fail(
          checkpoint.folder,
          f'unsupported architecture: {copy} differs from {original}; this model ties its '
          'decoder to the token embedding.',
      )


def _checkpoint_shape(tensor: Tensor, target: Tuple[int, ...], rows: int) -> Tuple[int, ...]:
  """The shape a tensor must have in the checkpoint to give a parameter of shape `target`."""
  if tensor.layout == 'linear':
    return target[::-1]
  if tensor.layout == 'heads_in':
    return (target[1] * target[2], target[0])
  if tensor.layout == 'heads_bias':
    return (target[0] * target[1],)
  if tensor.layout == 'heads_out':
    return (target[2], target[0] * target[1])
  if tensor.layout == 'positions':
    return (rows, target[1])
  return target


def _convert(tensor: Tensor, array: np.ndarray, target: Tuple[int, ...], offset: int) -> np.ndarray:
  """The checkpoint array as the parameter of shape `target`, float32."""
  array = np.asarray(array, np.float32)
  if tensor.layout == 'linear':
    return array.T
  if tensor.layout in ('heads_in', 'heads_out'):
    return array.T.reshape(target)
  if tensor.layout == 'heads_bias':
    return array.reshape(target)
  if tensor.layout == 'positions':
    return array[offset : offset + target[0]]
  return array


def to_params(checkpoint: Checkpoint, target_shapes: Mapping[Tuple[str, ...], Tuple[int, ...]]):
  """The checkpoint's tensors as parameters: parameter path -> float32 array.

  Args:
    checkpoint: the read checkpoint.
    target_shapes: path -> shape of every parameter of the masked-LM model
      (built with `model_fields`).

  Raises:
    ConfigError: a tensor is missing, or its shape is not the one config.json
      implies, or the decoder is untied.
  """
  _check_tied(checkpoint)
  head = _head_names(checkpoint.architecture)
  params = {}
  for tensor in tensor_map(checkpoint):
    name = tensor.name
    if name == head['bias'] and name not in checkpoint.tensors:
      name = head['decoder.bias']  # saved under its tied name only
    if name not in checkpoint.tensors:
      raise _fail(
          checkpoint.folder,
          f'the weights have no tensor {tensor.name} (a checkpoint without the masked-LM head, '
          'e.g. a bare encoder, cannot be imported).',
      )
    array, target = checkpoint.tensors[name], tuple(target_shapes[tensor.path])
    expected = _checkpoint_shape(tensor, target, checkpoint.config['max_position_embeddings'])
    if tuple(array.shape) != expected:
      raise _fail(
          checkpoint.folder,
          f'tensor {name} has shape {tuple(array.shape)}, but config.json implies {expected}; '
          'the weights do not match config.json.',
      )
    params[tensor.path] = _convert(tensor, array, target, checkpoint.position_offset)
  return params
