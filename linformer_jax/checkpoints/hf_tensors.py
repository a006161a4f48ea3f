"""Where each tensor of a Hugging Face RoBERTa or BERT checkpoint goes in this
project's masked-LM parameters, and the conversion of its layout.

`tensor_map` lists every tensor `models.MaskedLanguageModel` takes from a read
checkpoint (`hf_checkpoint.read_folder`): its name there, the parameter's
path, and how its layout changes (torch's Linear is [out, in]; the attention
projections split their heads). `to_params` checks each tensor's shape against
the one config.json implies and converts it; `unused_tensors` names the ones a
masked LM has no use for, and refuses any other. The masked-LM head's decoder
must be the token embedding: a saved copy that differs is refused.
"""

import dataclasses
from typing import Dict, List, Mapping, Tuple

import numpy as np

from linformer_jax.checkpoints import hf_checkpoint

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


def tensor_map(checkpoint: hf_checkpoint.Checkpoint) -> List[Tensor]:
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


def unused_tensors(checkpoint: hf_checkpoint.Checkpoint) -> List[str]:
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
    raise hf_checkpoint.fail(
        checkpoint.folder,
        f'unsupported architecture: {len(unknown)} tensor(s) this import cannot map, e.g. '
        f'{unknown[0]}.',
    )
  return unused


def _check_tied(checkpoint: hf_checkpoint.Checkpoint) -> None:
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
      raise hf_checkpoint.fail(
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


def to_params(
    checkpoint: hf_checkpoint.Checkpoint, target_shapes: Mapping[Tuple[str, ...], Tuple[int, ...]]
):
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
      raise hf_checkpoint.fail(
          checkpoint.folder,
          f'the weights have no tensor {tensor.name} (a checkpoint without the masked-LM head, '
          'e.g. a bare encoder, cannot be imported).',
      )
    array, target = checkpoint.tensors[name], tuple(target_shapes[tensor.path])
    expected = _checkpoint_shape(tensor, target, checkpoint.config['max_position_embeddings'])
    if tuple(array.shape) != expected:
      raise hf_checkpoint.fail(
          checkpoint.folder,
          f'tensor {name} has shape {tuple(array.shape)}, but config.json implies {expected}; '
          'the weights do not match config.json.',
      )
    params[tensor.path] = _convert(tensor, array, target, checkpoint.position_offset)
  return params
