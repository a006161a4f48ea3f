"""Where each tensor of a Hugging Face checkpoint goes in this project's
variables, and the conversion of its layout, in both directions.

Three architectures: RoBERTa and BERT (imported; a Transformer run exports
as either) and 'linformer', the remote-code model of `hf_remote/` that a
Linformer run exports as. Their encoders share RoBERTa's tensor names; a
Linformer's adds its sequence projections (E/F), a final layer norm when
pre-LN, and names its heads as RoBERTa does (BERT's are its own).

`TensorNames` holds what a checkpoint's names depend on; `tensor_map` lists
every tensor with the variable it is and how its layout changes (torch's
Linear is [out, in]; the attention projections split their heads). The one
list serves both directions: `to_params` checks a read checkpoint's tensors
against the shapes the model wants and converts them (import); `to_tensors`
converts a model's variables into tensors (export). `unused_tensors` names
the tensors a masked LM has no use for, and refuses any other. The masked-LM
head's decoder must be the token embedding: a saved copy that differs is
refused.
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.errors import ConfigError
from linformer_jax.model import projections

# How a tensor's layout (torch's Linear is [out, in]) becomes a parameter's:
#   same       as it is
#   linear     [out, in] -> [in, out]
#   heads_in   [heads * head_dim, hidden] -> [hidden, heads, head_dim]
#   heads_bias [heads * head_dim] -> [heads, head_dim]
#   heads_out  [hidden, heads * head_dim] -> [heads, head_dim, hidden]
#   positions  rows offset .. offset + max_len - 1 of the position table
LAYOUTS = ('same', 'linear', 'heads_in', 'heads_bias', 'heads_out', 'positions')
# The heads a checkpoint can hold, by the task of the run it is (config.task's names).
HEADS = ('masked_lm', 'causal_lm', 'classification')
# The variable collections a tensor is looked for in: trained, then fixed
# (a 'random' projection's E/F).
COLLECTIONS = ('params', 'constants')

# (checkpoint name after the encoder's prefix, parameter path, layout).
EMBEDDING_TENSORS = (
    ('embeddings.word_embeddings.weight', ('encoder', 'token_embedding', 'embedding'), 'same'),
    ('embeddings.position_embeddings.weight', ('encoder', 'position_embedding'), 'positions'),
)
SEGMENT_TENSOR = (
    'embeddings.token_type_embeddings.weight',
    ('encoder', 'segment_embedding'),
    'same',
)
# Post-LN: the embeddings' layer norm. Pre-LN: the final one.
EMBEDDING_NORM_TENSORS = (
    ('embeddings.LayerNorm.weight', ('encoder', 'embedding_norm', 'scale'), 'same'),
    ('embeddings.LayerNorm.bias', ('encoder', 'embedding_norm', 'bias'), 'same'),
)
FINAL_NORM_TENSORS = (
    ('encoder.final_norm.weight', ('encoder', 'final_norm', 'scale'), 'same'),
    ('encoder.final_norm.bias', ('encoder', 'final_norm', 'bias'), 'same'),
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
# A layer's own E/F (name after 'encoder.layer.I.attention.self.projection.'),
# or the model's shared one (after 'encoder.shared_projection.').
LAYER_PROJECTION = ('attention', 'projection')
SHARED_PROJECTION = ('encoder', 'shared_projection')
# (key of `_head_names`, parameter path, layout), per head.
HEAD_TENSORS = {
    'masked_lm': (
        ('dense.weight', ('mlm_dense', 'kernel'), 'linear'),
        ('dense.bias', ('mlm_dense', 'bias'), 'same'),
        ('norm.weight', ('mlm_norm', 'scale'), 'same'),
        ('norm.bias', ('mlm_norm', 'bias'), 'same'),
        ('bias', ('mlm_bias',), 'same'),
    ),
    'causal_lm': (('bias', ('lm_bias',), 'same'),),
    'classification': (
        ('dense.weight', ('classifier_dense', 'kernel'), 'linear'),
        ('dense.bias', ('classifier_dense', 'bias'), 'same'),
        ('out.weight', ('classifier_out', 'kernel'), 'linear'),
        ('out.bias', ('classifier_out', 'bias'), 'same'),
    ),
}
POOL_QUERY_TENSOR = ('pool_query', ('pool_query',), 'same')


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One checkpoint tensor and the variable it becomes."""

  name: str  # the tensor's name in the checkpoint
  path: Tuple[str, ...]  # the variable's path in its collection ('params' or 'constants')
  layout: str  # one of LAYOUTS


@dataclasses.dataclass(frozen=True)
class TensorNames:
  """What the tensor names of a checkpoint depend on.

  Attributes:
    architecture: 'roberta', 'bert' or 'linformer'.
    num_layers: the encoder's layers.
    prefix: before the encoder's names: 'roberta.', 'bert.', 'linformer.',
      or '' for an encoder saved bare.
    head: one of HEADS.
    segments: the encoder has a token-type (segment) embedding.
    pre_layer_norm: a final layer norm instead of the embeddings' one.
    projections: the names of the E/F weights of each layer's projection (or
      of the shared one): ('kv_projection',), ('key_projection',
      'value_projection'), or () for none (pooling, a Transformer, or a
      RoBERTa/BERT checkpoint, which holds no E/F).
    shared_projection: one projection for the whole model (sharing='layerwise').
    pool_query: the classifier's learned pooling query (pooling='attention').
  """

  architecture: str
  num_layers: int
  prefix: str
  head: str = 'masked_lm'
  segments: bool = True
  pre_layer_norm: bool = False
  projections: Tuple[str, ...] = ()
  shared_projection: bool = False
  pool_query: bool = False


def names_for(
    architecture: str, model_fields: Mapping[str, Any], head: str, prefix: Optional[str] = None
) -> TensorNames:
  """The tensor names of a model of `config.model` fields `model_fields` in
  `architecture`; RoBERTa and BERT hold no E/F whatever the attention."""
  projection_names, shared = (), False
  if architecture == 'linformer' and model_fields['attention'] == 'linformer':
    if projections.kind(model_fields['projection']).has_weights:
      one = model_fields['sharing'] in ('kv', 'layerwise')
      projection_names = ('kv_projection',) if one else ('key_projection', 'value_projection')
      shared = model_fields['sharing'] == 'layerwise'
  return TensorNames(
      architecture=architecture,
      num_layers=model_fields['num_layers'],
      prefix=f'{architecture}.' if prefix is None else prefix,
      head=head,
      segments=model_fields['num_segments'] > 0,
      pre_layer_norm=model_fields['pre_layer_norm'],
      projections=projection_names,
      shared_projection=shared,
      pool_query=head == 'classification' and model_fields['pooling'] == 'attention',
  )


def checkpoint_names(checkpoint: hf_checkpoint.Checkpoint) -> TensorNames:
  """The tensor names of a read checkpoint, imported as a masked LM."""
  return names_for(
      checkpoint.architecture,
      hf_checkpoint.model_fields(checkpoint),
      'masked_lm',
      checkpoint.prefix,
  )


def tensor_map(names: TensorNames) -> List[Tensor]:
  """Every tensor a checkpoint of these names holds, and where it goes."""
  prefix = names.prefix
  encoder = list(EMBEDDING_TENSORS)
  if names.segments:
    encoder.append(SEGMENT_TENSOR)
  encoder += FINAL_NORM_TENSORS if names.pre_layer_norm else EMBEDDING_NORM_TENSORS
  if names.shared_projection:
    encoder += [
        (f'encoder.shared_projection.{name}', SHARED_PROJECTION + (name,), 'same')
        for name in names.projections
    ]
  tensors = [Tensor(prefix + name, path, layout) for name, path, layout in encoder]
  layer_tensors = list(LAYER_TENSORS)
  if not names.shared_projection:
    layer_tensors += [
        (f'attention.self.projection.{name}', LAYER_PROJECTION + (name,), 'same')
        for name in names.projections
    ]
  for i in range(names.num_layers):
    tensors += [
        Tensor(f'{prefix}encoder.layer.{i}.{name}', ('encoder', f'layers_{i}') + path, layout)
        for name, path, layout in layer_tensors
    ]
  head_names = _head_names(names)
  head_tensors = HEAD_TENSORS[names.head] + ((POOL_QUERY_TENSOR,) if names.pool_query else ())
  return tensors + [Tensor(head_names[key], path, layout) for key, path, layout in head_tensors]


def _head_names(names: TensorNames) -> Dict[str, str]:
  """The head's tensor names by key; a masked LM's 'decoder.*' are the tied copies."""
  if names.architecture == 'bert':
    if names.head == 'classification':
      return {
          'dense.weight': f'{names.prefix}pooler.dense.weight',
          'dense.bias': f'{names.prefix}pooler.dense.bias',
          'out.weight': 'classifier.weight',
          'out.bias': 'classifier.bias',
      }
    parts = dict(
        dense='cls.predictions.transform.dense',
        norm='cls.predictions.transform.LayerNorm',
        bias='cls.predictions.bias',
        decoder='cls.predictions.decoder',
    )
  elif names.head == 'classification':
    return {
        'dense.weight': 'classifier.dense.weight',
        'dense.bias': 'classifier.dense.bias',
        'out.weight': 'classifier.out_proj.weight',
        'out.bias': 'classifier.out_proj.bias',
        'pool_query': 'classifier.pool_query',
    }
  else:
    parts = dict(dense='lm_head.dense', norm='lm_head.layer_norm', bias='lm_head.bias')
    parts['decoder'] = 'lm_head.decoder'
  return {
      'dense.weight': f'{parts["dense"]}.weight',
      'dense.bias': f'{parts["dense"]}.bias',
      'norm.weight': f'{parts["norm"]}.weight',
      'norm.bias': f'{parts["norm"]}.bias',
      'bias': parts['bias'],
      'decoder.weight': f'{parts["decoder"]}.weight',
      'decoder.bias': f'{parts["decoder"]}.bias',
  }


def unused_tensors(checkpoint: hf_checkpoint.Checkpoint) -> List[str]:
  """Tensors a masked LM has no use for: BERT's pooler and next-sentence head,
  saved position-id buffers, the tied decoder's copies (checked equal) and a
  RoBERTa token-type row of zeros (read as no segments).

  Raises:
    ConfigError: a tensor that is neither mapped nor one of these.
  """
  names = checkpoint_names(checkpoint)
  mapped = {tensor.name for tensor in tensor_map(names)}
  head = _head_names(names)
  ignored = {head['decoder.weight'], head['decoder.bias']}
  if not names.segments:
    ignored.add(checkpoint.prefix + SEGMENT_TENSOR[0])
  unused, unknown = [], []
  for name in sorted(checkpoint.tensors):
    if name in mapped:
      continue
    if (
        name in ignored
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


def _check_tied(checkpoint: hf_checkpoint.Checkpoint, names: TensorNames) -> None:
  """ConfigError if the saved decoder differs from the embedding and its bias."""
  head, tensors = _head_names(names), checkpoint.tensors
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


def _to_checkpoint_layout(tensor: Tensor, array: np.ndarray, offset: int) -> np.ndarray:
  """A parameter as the checkpoint holds it: `_convert` undone, float32."""
  array = np.asarray(array, np.float32)
  if tensor.layout == 'linear':
    return np.ascontiguousarray(array.T)
  if tensor.layout == 'heads_in':
    return np.ascontiguousarray(array.reshape(array.shape[0], -1).T)
  if tensor.layout == 'heads_out':
    return np.ascontiguousarray(array.reshape(-1, array.shape[-1]).T)
  if tensor.layout == 'heads_bias':
    return array.reshape(-1)
  if tensor.layout == 'positions':
    # The rows before `offset` are read only by padding positions (RoBERTa's).
    return np.concatenate([np.zeros((offset, array.shape[1]), np.float32), array])
  return np.ascontiguousarray(array)


def to_params(
    checkpoint: hf_checkpoint.Checkpoint,
    target_shapes: Mapping[Tuple[str, ...], Tuple[int, ...]],
) -> Dict[Tuple[str, ...], np.ndarray]:
  """The checkpoint's tensors as variables: variable path -> float32 array.

  Args:
    checkpoint: the read checkpoint.
    target_shapes: path -> shape of every variable of the masked-LM model
      (built with `hf_checkpoint.model_fields`), each path starting with its
      collection ('params', 'constants').

  Raises:
    ConfigError: a tensor is missing, or its shape is not the one config.json
      implies, or the decoder is untied.
  """
  names = checkpoint_names(checkpoint)
  _check_tied(checkpoint, names)
  head = _head_names(names)
  variables = {}
  for tensor in tensor_map(names):
    name = tensor.name
    if name == head.get('bias') and name not in checkpoint.tensors:
      name = head['decoder.bias']  # saved under its tied name only
    if name not in checkpoint.tensors:
      raise hf_checkpoint.fail(
          checkpoint.folder,
          f'the weights have no tensor {tensor.name} (a checkpoint without the masked-LM head, '
          'e.g. a bare encoder, cannot be imported).',
      )
    path = _collection_path(tensor.path, target_shapes)
    if path is None:
      raise hf_checkpoint.fail(
          checkpoint.folder,
          f'tensor {name} has no parameter {"/".join(tensor.path)} in the model config.json '
          'describes.',
      )
    array, target = checkpoint.tensors[name], tuple(target_shapes[path])
    expected = _checkpoint_shape(tensor, target, checkpoint.config['max_position_embeddings'])
    if tuple(array.shape) != expected:
      raise hf_checkpoint.fail(
          checkpoint.folder,
          f'tensor {name} has shape {tuple(array.shape)}, but config.json implies {expected}; '
          'the weights do not match config.json.',
      )
    variables[path] = _convert(tensor, array, target, checkpoint.position_offset)
  return variables


def _collection_path(
    path: Tuple[str, ...], present: Mapping[Tuple[str, ...], Any]
) -> Optional[Tuple[str, ...]]:
  """(collection,) + path for the first collection of COLLECTIONS holding it, else None."""
  for collection in COLLECTIONS:
    if (collection,) + path in present:
      return (collection,) + path
  return None


def flat_variables(variables: Mapping[str, Any]) -> Dict[Tuple[str, ...], np.ndarray]:
  """A variables tree ({'params': ..., 'constants': ...}) as path -> array."""
  flat = {}

  def visit(node, path):
    if isinstance(node, Mapping):
      for key, child in node.items():
        visit(child, path + (str(key),))
    else:
      flat[path] = np.asarray(node)

  visit(variables, ())
  return flat


def to_tensors(
    names: TensorNames, variables: Mapping[str, Any], *, position_offset: int = 0
) -> Tuple[Dict[str, np.ndarray], List[Tuple[str, ...]]]:
  """A model's variables as the checkpoint tensors of `names` (export).

  Args:
    names: the checkpoint's tensor names.
    variables: the model's variables, {'params': ..., 'constants': ...}.
    position_offset: zero rows before the position table (RoBERTa's
      pad_token_id + 1).

  Returns:
    tensor name -> float32 array in the checkpoint's layout, and the paths
    of the variables no tensor took.

  Raises:
    ConfigError: a variable the tensors need is missing.
  """
  flat = flat_variables(variables)
  tensors, taken = {}, set()
  for tensor in tensor_map(names):
    path = _collection_path(tensor.path, flat)
    if path is None:
      raise ConfigError(
          f'The variables have no {"/".join(tensor.path)}, which {names.architecture} tensor '
          f'{tensor.name} needs; they are not of this config.model.'
      )
    tensors[tensor.name] = _to_checkpoint_layout(tensor, flat[path], position_offset)
    taken.add(path)
  return tensors, sorted(set(flat) - taken)
