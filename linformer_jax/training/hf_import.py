"""A Hugging Face checkpoint (RoBERTa, BERT, or a Linformer folder this project
exported) written as a run of this project.

`import_checkpoint(source, workdir, config)` reads the checkpoint folder
(`checkpoints.hf_checkpoint`) and maps its tensors (`checkpoints.hf_tensors`),
sets the model fields it fixes and the tokenizer on top of `config`
(`checkpoints.hf_conversion`), and writes WORKDIR as a run at step 0:

  checkpoints/0/   the train state (the imported parameters, the optimizer's
                   initial state) with the config and the tokenizer's
                   fingerprint; no data position, so `train` starts the data
                   from the beginning
  tokenizer.json   the checkpoint's tokenizer, used for all later data
  config.json      the run's config (`configs/from_workdir.py` reads it back)
  import.json      where it came from, and what was not taken from it

With `model.attention='linformer'` the model's E/F projections (and nothing
else) keep the values the model initialises them with from `config.seed`,
unless the checkpoint holds them: a Linformer folder this project exported
(`checkpoints.hf_export`) is read back whole, its model fields (k, sharing,
projection, max_len, ...) included.
Every check runs before anything is written, and the folder appears whole
(written beside it, then renamed) or not at all.
"""

import json
import os
import pathlib
import shutil
from typing import Any, Dict, List, Tuple

import jax
import ml_collections
import numpy as np

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_conversion
from linformer_jax.checkpoints import hf_tensors
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.training import train_steps


def imported_variables(
    parts: run_builder.RunParts, checkpoint: hf_checkpoint.Checkpoint, seed: int
) -> Tuple[Dict[str, Any], List[str]]:
  """The model's variables ({'params': ..., other collections}) holding the
  checkpoint's tensors, split over the mesh as `parts` lays them out, and the
  parameters that keep their initial values (E/F, as a new run seeded by
  `seed` draws them)."""
  abstract = parts.abstract_variables()
  shapes = {
      tuple(entry.key for entry in path): leaf.shape
      for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
  }
  variables, kept = hf_conversion.variables_with(abstract, hf_tensors.to_params(checkpoint, shapes))
  if kept:
    # E/F (learned or fixed random) as a new run of this config draws them.
    is_kept = lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct)
    variables = jax.tree_util.tree_map(
        lambda new, old: old if is_kept(new) else new,
        variables,
        parts.initial_variables(seed),
        is_leaf=is_kept,
    )
  return jax.device_put(variables, run_builder.shardings_of(abstract)), kept


def build_state(
    config: ml_collections.ConfigDict, checkpoint: hf_checkpoint.Checkpoint
) -> Tuple[run_builder.RunParts, train_steps.TrainState, List[str]]:
  """The run's parts and its step-0 train state holding the imported weights,
  and the parameters that keep their initial values (E/F)."""
  parts = run_builder.build_parts(config)
  variables, kept = imported_variables(parts, checkpoint, config.seed)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  abstract_state = parts.abstract_train_state(optimizer)
  params = variables.pop('params')
  state = train_steps.TrainState(
      step=jax.device_put(np.int32(0), abstract_state.step.sharding),
      params=params,
      opt_state=optimizer.init(params),
      constants=variables,
  )
  return parts, state, kept


def _check_workdir(workdir: str) -> None:
  if storage.is_object_store(storage.location(workdir)):
    raise ConfigError(
        f'--workdir={workdir}: an import is written to a local folder (it is staged, then '
        'renamed into place); import locally, then copy the folder to the bucket '
        '(gcloud storage cp -r).'
    )
  if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
    raise ConfigError(
        f'--workdir={workdir} already exists; the import writes a new run, give a new --workdir.'
    )
  storage.check_folder(workdir)


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
    ConfigError: see `hf_checkpoint.read_folder` and `hf_tensors.to_params`, a
      workdir that exists, a config the model cannot be built from; nothing is
      written.
  """
  ModelConfig.from_config(config.model).require_unscanned('import_checkpoint')
  _check_workdir(workdir)
  checkpoint = hf_checkpoint.read_folder(hf_conversion.resolve_source(source))
  unused = hf_tensors.unused_tensors(checkpoint)
  config = hf_conversion.imported_config(config, checkpoint)
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
  with storage.staged_folder(pathlib.Path(workdir), 'importing') as staging:
    staged_run = run_folder.RunFolder(str(staging))
    shutil.copyfile(
        checkpoint.folder / hf_checkpoint.TOKENIZER_FILE, staged_run.tokenizer('huggingface')
    )
    pathlib.Path(staged_run.config).write_text(
        json.dumps(parts.settings.to_dict(), indent=2, sort_keys=True)
    )
    pathlib.Path(staged_run.import_summary).write_text(json.dumps(summary, indent=2))
    with CheckpointStore(staged_run.checkpoints, async_save=False) as store:
      store.save(
          0,
          state=state,
          # No process_states: nothing has read the data yet.
          data_state={
              'process_states': None,
              'tokenizer_sha256': checkpoint.tokenizer.sha256,
          },
          config=parts.settings.to_dict(),
          force=True,
      )
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
