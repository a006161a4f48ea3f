"""What a Hugging Face checkpoint decides about a run: its folder, its config
and its parameters.

`resolve_source` finds the checkpoint folder (a path, or a hub name it
downloads); `imported_config` puts the checkpoint's model fields and tokenizer
on top of a run's config; `variables_with` places the converted tensors
(`hf_tensors.to_params`) into the model's variables, leaving the sequence
projections E/F that a RoBERTa or BERT checkpoint does not hold to the
model's own initialisation (a Linformer folder holds them).
"""

import os
import re
from typing import Any, Dict, List, Tuple

import jax
import ml_collections

from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.errors import ConfigError
from linformer_jax.model.layers import PROJECTION_NAMES

# A hub name, owner/name or name: never a path with more parts.
_HUB_NAME = re.compile(r'^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$')
# The files a hub download takes: config, weights, tokenizer.
_HUB_FILES = ['config.json', 'model.safetensors*', 'tokenizer.json', 'tokenizer_config.json']


def resolve_source(source: str) -> str:
  """The local folder of `source`: itself, or a download of a hub name.

  Raises:
    ConfigError: no such folder, and `source` is no hub name or the hub
      cannot be reached.
  """
  if os.path.isdir(source) or not _HUB_NAME.match(source) or os.path.exists(source):
    return source
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top  # only for hub names

    return huggingface_hub.snapshot_download(repo_id=source, allow_patterns=_HUB_FILES)
  except Exception as error:  # pylint: disable=broad-except  # offline, unknown name, HTTP
    raise ConfigError(
        f'--from={source}: no such folder, and the hub cannot give it '
        f'({type(error).__name__}); download the folder (config.json, model.safetensors, '
        'tokenizer.json) where there is network and pass its path.'
    ) from None


def imported_config(
    config: ml_collections.ConfigDict, checkpoint: hf_checkpoint.Checkpoint
) -> ml_collections.ConfigDict:
  """`config` with the checkpoint's model fields and its tokenizer.

  model.max_len stays the config's for RoBERTa and BERT: the first max_len
  positions of the checkpoint's table are taken (ConfigError if it has
  fewer). A Linformer folder sets it, with every other model field.
  """
  imported = ml_collections.ConfigDict(config.to_dict())
  if imported.get('task', 'masked_lm') != 'masked_lm':
    raise ConfigError(
        f'config.task={imported.task!r}: a checkpoint is imported as a masked LM; use a '
        'masked_lm config (configs/imported.py), then fine-tune it with init_from.'
    )
  fields = hf_checkpoint.model_fields(checkpoint)
  if 'max_len' not in fields and imported.model.max_len > checkpoint.max_positions:
    raise ConfigError(
        f'config.model.max_len={imported.model.max_len} is longer than the '
        f'{checkpoint.max_positions} positions of {checkpoint.folder}; set '
        f'--config.model.max_len={checkpoint.max_positions} or less.'
    )
  with imported.model.ignore_type():  # projected_len may be one k per layer
    imported.model.update(fields)
  imported.data.tokenizer = 'huggingface'
  imported.data.vocab_size = checkpoint.tokenizer.vocab_size
  return imported


def variables_with(
    abstract: Dict[str, Any], imported: Dict[Tuple[str, ...], Any]
) -> Tuple[Dict[str, Any], List[str]]:
  """The variables tree of `abstract` with the imported arrays put in, and the
  paths of the leaves left abstract (no tensor maps to them).

  Args:
    abstract: the model's variables ({'params': ..., 'constants': ...}) as
      `jax.ShapeDtypeStruct` leaves.
    imported: variable path (collection first) -> array, as
      `hf_tensors.to_params` gives.

  Raises:
    ValueError: a variable neither imported nor a sequence projection.
  """
  missing = []

  def leaf(path, value):
    key = tuple(entry.key for entry in path)
    if key in imported:
      return imported[key]
    if key[-1] not in PROJECTION_NAMES:
      raise ValueError(f'No checkpoint tensor maps to variable {"/".join(key)}.')
    missing.append('/'.join(key[1:]))
    return value

  return jax.tree_util.tree_map_with_path(leaf, abstract), missing
