"""A run written as a Hugging Face folder that `transformers` loads (the export).

`export_folder(config, variables, tokenizer, out_dir)` writes OUT_DIR:

  config.json            the model's settings and `architectures`; a
                         Linformer's `auto_map` names its remote code
  model.safetensors      the variables as float32 tensors in torch's layouts
                         (`hf_tensors`: the import's table, read backwards)
  tokenizer.json, tokenizer_config.json
                         the run's tokenizer: AutoTokenizer gives its ids
                         (`hf_tokenizer`)
  configuration_linformer.py, modeling_linformer.py
                         a Linformer's remote code (`hf_remote/`), as it is
  README.md              the model card: the hub's metadata, what the model
                         is, how to load it

What a run becomes:

* A Transformer (model.attention='full') that RoBERTa or BERT computes
  exactly (post-LN, bidirectional, a masked LM or a classifier reading the
  first token, with a tokenizer) is a plain RobertaFor... folder
  (num_segments 0 or 1; 0 writes one token-type row of zeros, which the
  import reads back as none) or BertFor... folder (num_segments 2 or more):
  ...ForMaskedLM or ...ForSequenceClassification, no remote code. RoBERTa's
  positions start after pad_token_id; the rows before are zeros.
* Any other run of the built-in kinds 'linformer' and 'full' is
  model_type 'linformer' with remote code: LinformerForMaskedLM,
  LinformerForSequenceClassification or LinformerForCausalLM, by
  config.task; every built-in projection (linear, random, mean, max, conv)
  and sharing mode (none, headwise, kv, layerwise), k per layer, pre-LN or
  post-LN, segments, every pooling, the causal Linformer's blocks.
* A classifier's labels are config.data.labels (id2label); a task without
  labels of its own (ListOps) numbers its classes.

Refused in one line (`ConfigError`), with nothing written: another attention
kind (the rivals, an extension's), an extension's projection or task, a
setting an extension's kind declares, variables the folder would not hold
(a kind's own parameters), a tokenizer of another vocabulary, an OUT_DIR
that exists and is not empty, or is in a bucket.

The tensors are the variables bitwise: `import_checkpoint` reads a masked-LM
folder back into the same variables (`hf_checkpoint`, `hf_tensors`). A
bfloat16 run (model.dtype) exports its float32 parameters, and the PyTorch
model computes in float32; scanned layers (model.scan_layers) are written
one by one. The folder appears whole (written beside OUT_DIR, then renamed)
or not at all.

transformers 5 reads config.json for AutoTokenizer too, so a remote-code
folder's tokenizer wants `trust_remote_code=True` as its model does (without
it, an interactive session is asked first).
"""

import dataclasses
import json
import pathlib
from typing import Any, Dict, List, Mapping, Optional

import ml_collections
import numpy as np
import safetensors.numpy

from linformer_jax import storage
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_tensors
from linformer_jax.checkpoints import hf_tokenizer
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import projections
from linformer_jax.model.model_config import ModelConfig

REMOTE_CODE = pathlib.Path(__file__).resolve().parent / 'hf_remote'
REMOTE_FILES = ('configuration_linformer.py', 'modeling_linformer.py')
# config.json's key for the run's own config, which `linformer_jax.load` of the
# folder builds from (transformers keeps an unknown key as an attribute).
RUN_CONFIG_KEY = 'linformer_jax_run_config'
# The attention kinds the PyTorch model computes.
EXPORTED_ATTENTION = ('full', 'linformer')
# The class of each head, per architecture, and the auto class that loads it.
CLASSES = {
    'roberta': {
        'masked_lm': 'RobertaForMaskedLM',
        'classification': 'RobertaForSequenceClassification',
    },
    'bert': {'masked_lm': 'BertForMaskedLM', 'classification': 'BertForSequenceClassification'},
    'linformer': {
        'masked_lm': 'LinformerForMaskedLM',
        'classification': 'LinformerForSequenceClassification',
        'causal_lm': 'LinformerForCausalLM',
    },
}
AUTO_CLASSES = {
    'masked_lm': 'AutoModelForMaskedLM',
    'classification': 'AutoModelForSequenceClassification',
    'causal_lm': 'AutoModelForCausalLM',
}
# The standard deviation of new dense weights (`layers.DENSE_INIT`), for fine-tuning.
INITIALIZER_RANGE = 0.02
MODEL_CARD_FILE = 'README.md'
# The hub's pipeline of each head, for the model card.
PIPELINES = {
    'masked_lm': 'fill-mask',
    'classification': 'text-classification',
    'causal_lm': 'text-generation',
}


def _head_of(config: ml_collections.ConfigDict) -> str:
  if config.task not in hf_tensors.HEADS:
    raise ConfigError(
        f'config.task={config.task!r} has no Hugging Face head; the export writes the tasks '
        f'{hf_tensors.HEADS}.'
    )
  return config.task


def _check_exportable(model: ModelConfig) -> None:
  """ConfigError, in one line, for a model the PyTorch side does not compute."""
  if model.attention not in EXPORTED_ATTENTION:
    if model.attention not in attention_kinds.BUILT_IN:
      raise ConfigError(
          f"config.model.attention={model.attention!r} is an extension's attention kind; the "
          f'export writes the built-in kinds {EXPORTED_ATTENTION} only.'
      )
    raise ConfigError(
        f'config.model.attention={model.attention!r} has no PyTorch form; the export writes '
        f'the kinds {EXPORTED_ATTENTION}.'
    )
  if model.attention_kind.uses_projection and model.projection not in projections.BUILT_IN:
    raise ConfigError(
        f"config.model.projection={model.projection!r} is an extension's projection; the "
        f'export writes the built-in projections {projections.BUILT_IN} only.'
    )
  if model.extension_settings:
    name = model.extension_settings[0][0]
    raise ConfigError(
        f"config.model.{name} is a setting of an extension's kind; the export writes the "
        'built-in kinds only.'
    )


def architecture_of(
    model: ModelConfig, head: str, tokenizer: Optional[tokenizer_lib.Tokenizer]
) -> str:
  """'roberta' or 'bert' for a Transformer they compute exactly, else 'linformer'.

  RoBERTa's positions skip the padding id, so a plain folder needs the
  tokenizer's pad id; BERT's classifier reads the first token.
  """
  plain = (
      model.attention == 'full'
      and not model.causal
      and not model.pre_layer_norm
      and tokenizer is not None
      and (head == 'masked_lm' or (head == 'classification' and model.pooling == 'first'))
  )
  if not plain:
    return 'linformer'
  return 'bert' if model.num_segments >= 2 else 'roberta'


def _unscanned(variables: Mapping[str, Any], num_layers: int) -> Dict[str, Any]:
  """Variables of scanned layers (encoder/layers/layer, a leading layers axis)
  as the unscanned model holds them (encoder/layers_0, layers_1, ...)."""

  def layer_slice(tree, layer):
    if isinstance(tree, Mapping):
      return {key: layer_slice(child, layer) for key, child in tree.items()}
    return np.asarray(tree)[layer]

  unscanned = {}
  for collection, tree in variables.items():
    tree = dict(tree)
    encoder = dict(tree.get('encoder', {}))
    scanned = encoder.pop('layers', None)
    if scanned is not None:
      for layer in range(num_layers):
        encoder[f'layers_{layer}'] = layer_slice(scanned['layer'], layer)
      tree['encoder'] = encoder
    unscanned[collection] = tree
  return unscanned


def _labels(config: ml_collections.ConfigDict, num_classes: int) -> List[str]:
  """The classes' names: config.data.labels, or their numbers where it names none."""
  labels = [str(label) for label in config.data.labels]
  return labels if len(labels) == num_classes else [str(i) for i in range(num_classes)]


def _config_json(
    architecture: str,
    head: str,
    model: ModelConfig,
    tokenizer: Optional[tokenizer_lib.Tokenizer],
    labels: Optional[List[str]],
) -> Dict[str, Any]:
  """config.json: what transformers builds the model from."""
  class_name = CLASSES[architecture][head]
  fields = {'architectures': [class_name], 'model_type': architecture}
  fields.update({theirs: getattr(model, ours) for theirs, ours in hf_checkpoint.ENCODER_FIELDS})
  fields.update(
      hidden_act='gelu',
      hidden_dropout_prob=model.dropout_rate,
      attention_probs_dropout_prob=model.attention_dropout_rate,
      initializer_range=INITIALIZER_RANGE,
      tie_word_embeddings=True,
  )
  if architecture == 'linformer':
    fields.update({name: getattr(model, name) for name in hf_checkpoint.LINFORMER_FIELDS})
    if isinstance(model.projected_len, tuple):
      fields['projected_len'] = list(model.projected_len)
    fields['max_position_embeddings'] = model.max_len
    fields['activation_dropout'] = model.activation_dropout_rate
    module = REMOTE_FILES[1].removesuffix('.py')
    fields['auto_map'] = {'AutoConfig': 'configuration_linformer.LinformerConfig'}
    fields['auto_map']['AutoModel'] = f'{module}.LinformerModel'
    heads = ('causal_lm',) if model.causal else ('masked_lm', 'classification')
    fields['auto_map'].update(
        {AUTO_CLASSES[name]: f'{module}.{CLASSES["linformer"][name]}' for name in heads}
    )
  else:
    fields.update(
        max_position_embeddings=model.max_len + _position_offset(architecture, tokenizer),
        type_vocab_size=max(model.num_segments, 1),
    )
  if tokenizer is not None:
    fields.update(
        pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id
    )
  if labels is not None:
    fields['id2label'] = dict(enumerate(labels))
    fields['label2id'] = {label: i for i, label in enumerate(labels)}
  return fields


def _model_card(
    architecture: str,
    head: str,
    model: ModelConfig,
    name: str,
    tokenizer: Optional[tokenizer_lib.Tokenizer],
) -> str:
  """README.md: the hub's metadata, what the model is and how to load it."""
  remote = architecture == 'linformer'
  if model.attention == 'linformer':
    attention = (
        f'Linformer attention (k = {model.projected_len}, projection {model.projection!r}, '
        f'sharing {model.sharing!r}'
        + (f', causal blocks of {model.block_len}' if model.causal else '')
        + ')'
    )
  else:
    attention = 'full attention' + (', causal' if model.causal else '')
  trust = ', trust_remote_code=True' if remote else ''
  auto_class = AUTO_CLASSES[head]
  lines = [
      '---',
      'library_name: transformers',
      f'pipeline_tag: {PIPELINES[head]}',
      'tags:',
      '- linformer_jax',
      f'- {"linformer" if model.attention == "linformer" else architecture}',
      '---',
      '',
      f'# {name}',
      '',
      f'A {CLASSES[architecture][head]} trained with linformer_jax and exported by it: '
      f'{model.num_layers} layers, {model.hidden_dim} wide, {model.num_heads} heads, '
      f'{"pre" if model.pre_layer_norm else "post"}-LN, inputs of up to {model.max_len} tokens, '
      f'{attention}. Pad rows on the right.',
      '',
      '```python',
      f'from transformers import {auto_class}' + (', AutoTokenizer' if tokenizer else ''),
      '',
      f'model = {auto_class}.from_pretrained({name!r}{trust})',
  ]
  if tokenizer is not None:
    lines.append(f'tokenizer = AutoTokenizer.from_pretrained({name!r}{trust})')
  return '\n'.join(lines + ['```', ''])


def _position_offset(architecture: str, tokenizer: Optional[tokenizer_lib.Tokenizer]) -> int:
  """The rows of RoBERTa's position table before position 0 (pad_token_id + 1)."""
  return tokenizer.pad_id + 1 if architecture == 'roberta' else 0


def _tensors(
    architecture: str,
    head: str,
    model: ModelConfig,
    variables: Mapping[str, Any],
    tokenizer: Optional[tokenizer_lib.Tokenizer],
) -> Dict[str, np.ndarray]:
  """The folder's tensors, by name; ConfigError for a variable none of them holds."""
  if model.scan_layers:
    variables = _unscanned(variables, model.num_layers)
  fields = {field.name: getattr(model, field.name) for field in dataclasses.fields(model)}
  names = hf_tensors.names_for(architecture, fields, head)
  if architecture == 'roberta' and not names.segments:
    # RoBERTa always adds a token-type row: zeros add nothing.
    names = dataclasses.replace(names, segments=True)
    encoder = dict(variables['params']['encoder'])
    encoder['segment_embedding'] = np.zeros((1, model.hidden_dim), np.float32)
    variables = {**variables, 'params': {**variables['params'], 'encoder': encoder}}
  tensors, left = hf_tensors.to_tensors(
      names, variables, position_offset=_position_offset(architecture, tokenizer)
  )
  if left:
    raise ConfigError(
        f'The variable {"/".join(left[0])} has no tensor in a {architecture} folder; the '
        'export writes the built-in models only.'
    )
  return tensors


def _checked_out_dir(out_dir: str) -> pathlib.Path:
  if storage.is_object_store(storage.location(out_dir)):
    raise ConfigError(
        f'{out_dir}: the export writes a local folder (staged, then renamed into place); '
        'export locally, then copy the folder to the bucket or upload it to the hub.'
    )
  target = pathlib.Path(out_dir)
  if target.exists() and (not target.is_dir() or any(target.iterdir())):
    raise ConfigError(f'{out_dir} already exists and is not empty; export into a new folder.')
  return target


def _write(target: pathlib.Path, files: Mapping[str, str], tensors: Mapping[str, np.ndarray]):
  """Writes the folder beside `target`, then renames it into place."""
  with storage.staged_folder(target, 'exporting') as staging:
    for name, text in files.items():
      (staging / name).write_text(text)
    safetensors.numpy.save_file(
        dict(tensors), str(staging / hf_checkpoint.WEIGHTS_FILE), metadata={'format': 'pt'}
    )


def export_folder(
    config: ml_collections.ConfigDict,
    variables: Mapping[str, Any],
    tokenizer: Optional[tokenizer_lib.Tokenizer],
    out_dir: str,
) -> Dict[str, Any]:
  """Writes a run as a Hugging Face folder; see the module docstring.

  Args:
    config: the run's config (its config.json, complete, with the
      extensions it names imported).
    variables: the model's variables, {'params': ..., 'constants': ...}
      (`linformer_jax.load(workdir).variables`).
    tokenizer: the run's tokenizer, or None for a run without one (ListOps):
      the folder then holds no tokenizer files.
    out_dir: a local folder that does not exist or is empty.

  Returns:
    What was written: the folder, architecture, class, auto class, head,
    whether it holds remote code, the tokenizer's kind, the tensors and
    their numbers, the labels, the files, and notes.

  Raises:
    ConfigError: what the export cannot write, in one line; nothing is written.
  """
  head = _head_of(config)
  model = ModelConfig.from_config(config.model)
  _check_exportable(model)
  target = _checked_out_dir(out_dir)
  if tokenizer is not None and tokenizer.vocab_size != model.vocab_size:
    raise ConfigError(
        f'The tokenizer has {tokenizer.vocab_size} tokens and config.model.vocab_size is '
        f"{model.vocab_size}; give the run's own tokenizer."
    )
  architecture = architecture_of(model, head, tokenizer)
  tensors = _tensors(architecture, head, model, variables, tokenizer)
  labels = None
  if head == 'classification':
    labels = _labels(config, np.shape(variables['params']['classifier_out']['bias'])[0])
  fields = _config_json(architecture, head, model, tokenizer, labels)
  fields[RUN_CONFIG_KEY] = json.loads(json.dumps(config.to_dict()))
  files = {hf_checkpoint.CONFIG_FILE: json.dumps(fields, indent=2) + '\n'}
  tokenizer_kind = None
  if tokenizer is not None:
    tokenizer_texts, tokenizer_kind = hf_tokenizer.tokenizer_files(
        tokenizer,
        max_len=model.max_len,
        with_segments=model.num_segments >= 2,
        causal=model.causal,
    )
    files.update(tokenizer_texts)
  if architecture == 'linformer':
    files.update({name: (REMOTE_CODE / name).read_text() for name in REMOTE_FILES})
  files[MODEL_CARD_FILE] = _model_card(architecture, head, model, target.name, tokenizer)
  _write(target, files, tensors)
  notes = []
  if model.dtype != 'float32':
    notes.append(
        f'config.model.dtype={model.dtype!r}: the folder holds the float32 parameters, and '
        'PyTorch computes in float32.'
    )
  return {
      'folder': str(target),
      'architecture': architecture,
      'class': CLASSES[architecture][head],
      'auto_class': AUTO_CLASSES[head],
      'head': head,
      'remote_code': architecture == 'linformer',
      'import_flags': _import_flags(architecture, model),
      'tokenizer': tokenizer_kind,
      'tensors': len(tensors),
      'numbers': int(sum(array.size for array in tensors.values())),
      'labels': labels,
      'files': sorted(files) + [hf_checkpoint.WEIGHTS_FILE],
      'notes': notes,
  }


def _import_flags(architecture: str, model: ModelConfig) -> List[str]:
  """The config flags `import_checkpoint --config configs/imported.py` needs for
  the folder: a RoBERTa or BERT folder keeps the config's max_len (and k),
  a Linformer folder sets them itself."""
  if architecture == 'linformer':
    return []
  k = model.projected_len if isinstance(model.projected_len, int) else min(model.projected_len)
  return [f'--config.model.max_len={model.max_len}', f'--config.model.projected_len={k}']


def describe(summary: Mapping[str, Any]) -> List[str]:
  """The lines the export command prints about a written folder."""
  folder, remote = summary['folder'], summary['remote_code']
  kind = 'remote code' if remote else 'no remote code'
  tokenizer = summary['tokenizer'] or 'none (the run has none)'
  lines = [
      f'Exported a {summary["head"]} run as {summary["class"]} ({kind}) into {folder}: '
      f'{summary["tensors"]} tensors, {summary["numbers"]:,} numbers; tokenizer {tokenizer}.'
  ]
  # transformers 5 reads config.json for the tokenizer too, and asks before running its code.
  trust = ', trust_remote_code=True' if remote else ''
  lines.append(
      f'Load it with transformers.{summary["auto_class"]}.from_pretrained({folder!r}{trust})'
      + (f' and AutoTokenizer.from_pretrained({folder!r}{trust}).' if summary['tokenizer'] else '.')
  )
  if summary['head'] == 'masked_lm':
    flags = ''.join(f' {flag}' for flag in summary['import_flags'])
    lines.append(
        f'Read it back with python -m linformer_jax.import_checkpoint --from {folder} '
        f'--workdir RUN --config configs/imported.py{flags}.'
    )
  return lines + list(summary['notes'])
