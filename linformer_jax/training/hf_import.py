"""A Hugging Face RoBERTa or BERT checkpoint written as a run of this project.

`import_checkpoint(source, workdir, config)` reads the checkpoint folder
(`hf_checkpoint`), sets the model fields it fixes and the tokenizer on top of
`config`, and writes WORKDIR as a run at step 0:

  checkpoints/0/   the train state (the imported parameters, the optimizer's
                   initial state) with the config and the tokenizer's
                   fingerprint; no data position, so `train` starts the data
                   from the beginning
  tokenizer.json   the checkpoint's tokenizer, used for all later data
  config.json      the run's config (`configs/from_workdir.py` reads it back)
  import.json      where it came from, and what was not taken from it

With `model.attention='linformer'` the model's E/F projections (and nothing
else) keep the values the model initialises them with from `config.seed`.
Every check runs before anything is written, and the folder appears whole
(written beside it, then renamed) or not at all.
"""

import json
import os
import pathlib
import re
import shutil
from typing import Any, Dict, List, Tuple

import jax
import ml_collections
import numpy as np

from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.model.layers import PROJECTION_NAMES
from linformer_jax.training import hf_checkpoint
from linformer_jax.training import run_builder
from linformer_jax.training import train_steps
from linformer_jax.training.checkpoints import CheckpointStore
from linformer_jax.training.checkpoints import checkpoint_directory

IMPORT_FILE = 'import.json'
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

  model.max_len stays the config's: the first max_len positions of the
  checkpoint's table are taken (ConfigError if it has fewer).
  """
  imported = ml_collections.ConfigDict(config.to_dict())
  if imported.get('task', 'masked_lm') != 'masked_lm':
    raise ConfigError(
        f'config.task={imported.task!r}: a checkpoint is imported as a masked LM; use a '
        'masked_lm config (configs/imported.py), then fine-tune it with init_from.'
    )
  if imported.model.max_len > checkpoint.max_positions:
    raise ConfigError(
        f'config.model.max_len={imported.model.max_len} is longer than the '
        f'{checkpoint.max_positions} positions of {checkpoint.folder}; set '
        f'--config.model.max_len={checkpoint.max_positions} or less.'
    )
  imported.model.update(hf_checkpoint.model_fields(checkpoint))
  imported.data.tokenizer = 'huggingface'
  imported.data.vocab_size = checkpoint.tokenizer.vocab_size
  return imported


def _params_with(
    abstract: Dict[str, Any], imported: Dict[Tuple[str, ...], Any]
) -> Tuple[Dict[str, Any], List[str]]:
  """The params tree of `abstract` with the imported arrays put in, and the
  paths of the leaves left abstract (no tensor maps to them).

  Raises:
    ValueError: a parameter neither imported nor a sequence projection.
  """
  missing = []

  def leaf(path, value):
    key = tuple(entry.key for entry in path)
    if key in imported:
      return imported[key]
    if key[-1] not in PROJECTION_NAMES:
      raise ValueError(f'No checkpoint tensor maps to parameter {"/".join(key)}.')
    missing.append('/'.join(key))
    return value

  return jax.tree_util.tree_map_with_path(leaf, abstract), missing


def build_state(
    config: ml_collections.ConfigDict, checkpoint: hf_checkpoint.Checkpoint
) -> Tuple[run_builder.RunParts, train_steps.TrainState, List[str]]:
  """The run's parts and its step-0 train state holding the imported weights,
  and the parameters that keep their initial values (E/F)."""
  parts = run_builder.build_parts(config)
  optimizer = train_steps.create_optimizer(config)
  abstract_state = parts.abstract_train_state(optimizer)
  shapes = {
      tuple(entry.key for entry in path): leaf.shape
      for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state.params)
  }
  params, kept = _params_with(abstract_state.params, hf_checkpoint.to_params(checkpoint, shapes))
  constants = abstract_state.constants
  if kept or jax.tree_util.tree_leaves(constants):
    # E/F (and fixed random projections) as a new run of this config draws them.
    init = jax.jit(
        lambda rng: train_steps.init_train_state(
            rng, model=parts.model, optimizer=optimizer, seq_len=parts.model_config.max_len
        ),
        out_shardings=run_builder.shardings_of(abstract_state),
    )
    initial = init(jax.random.PRNGKey(config.seed))
    is_kept = lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct)
    params = jax.tree_util.tree_map(
        lambda new, old: old if is_kept(new) else new, params, initial.params, is_leaf=is_kept
    )
    constants = initial.constants
  params = jax.device_put(params, run_builder.shardings_of(abstract_state.params))
  state = train_steps.TrainState(
      step=jax.device_put(np.int32(0), abstract_state.step.sharding),
      params=params,
      opt_state=optimizer.init(params),
      constants=constants,
  )
  return parts, state, kept


def _check_workdir(workdir: str) -> None:
  if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
    raise ConfigError(
        f'--workdir={workdir} already exists; the import writes a new run, give a new --workdir.'
    )


def import_checkpoint(
    source: str, workdir: str, config: ml_collections.ConfigDict
) -> Tuple[ml_collections.ConfigDict, Dict[str, Any]]:
  """Writes the checkpoint folder (or hub name) `source` as a run in `workdir`.

  Args:
    source: a Hugging Face checkpoint folder, or a hub name (downloaded when
      the hub can be reached).
    workdir: the new run's folder; must not exist (or be empty).
    config: the run's config; its model fields that the checkpoint fixes
      (sizes, layer-norm epsilon, segments) are replaced by the checkpoint's,
      its data.tokenizer becomes 'huggingface'.

  Returns:
    The run's config, and what `import.json` records: the source, the
    architecture, the model fields taken, the parameters that keep their
    initial values and the tensors a masked LM has no use for.

  Raises:
    ConfigError: see `hf_checkpoint.read_folder` and `to_params`, a workdir
      that exists, a config the model cannot be built from; nothing is written.
  """
  _check_workdir(workdir)
  checkpoint = hf_checkpoint.read_folder(resolve_source(source))
  unused = hf_checkpoint.unused_tensors(checkpoint)
  config = imported_config(config, checkpoint)
  parts, state, kept = build_state(config, checkpoint)
  summary = {
      'source': str(source),
      'folder': str(checkpoint.folder.resolve()),
      'architecture': checkpoint.architecture,
      'model_fields': hf_checkpoint.model_fields(checkpoint),
      'max_len': parts.model_config.max_len,
      'attention': parts.model_config.attention,
      'initialised_parameters': kept,
      'unused_tensors': unused,
  }
  target = pathlib.Path(workdir)
  staging = target.with_name(f'{target.name}.importing{os.getpid()}')
  shutil.rmtree(staging, ignore_errors=True)
  try:
    staging.mkdir(parents=True)
    shutil.copyfile(
        checkpoint.folder / tokenizer_lib.HUGGINGFACE_FILENAME,
        staging / tokenizer_lib.HUGGINGFACE_FILENAME,
    )
    (staging / 'config.json').write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    (staging / IMPORT_FILE).write_text(json.dumps(summary, indent=2))
    with CheckpointStore(checkpoint_directory(str(staging)), async_save=False) as store:
      store.save(
          0,
          state=state,
          # No process_states: nothing has read the data yet.
          data_state={
              'process_states': None,
              'tokenizer_sha256': checkpoint.tokenizer.sha256,
          },
          config=config.to_dict(),
          force=True,
      )
    if target.is_dir():
      target.rmdir()  # empty (checked): the rename needs it gone
    os.rename(staging, target)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return config, summary


def describe(summary: Dict[str, Any], workdir: str) -> List[str]:
  """The lines the command prints about an import into `workdir`."""
  fields = ', '.join(f'{k}={v}' for k, v in summary['model_fields'].items())
  lines = [
      f'Imported {summary["architecture"]} from {summary["folder"]} into {workdir} (step 0): '
      f'{summary["attention"]} attention, max_len={summary["max_len"]}; from the checkpoint: '
      f'{fields}.'
  ]
  if summary['initialised_parameters']:
    lines.append(
        'Initialised as the model initialises them (not in the checkpoint): '
        + ', '.join(summary['initialised_parameters'])
        + '.'
    )
  if summary['unused_tensors']:
    lines.append('Not used by a masked LM: ' + ', '.join(summary['unused_tensors']) + '.')
  lines.append(
      f'Evaluate or continue training with --config configs/from_workdir.py:{workdir} '
      f'--workdir {workdir}.'
  )
  lines.append(
      f'Fine-tune with --config configs/finetune_sst2.py:{workdir} (any configs/finetune_*.py).'
  )
  return lines
