"""A run's checkpoint scored on a split: what `linformer_jax.evaluate` prints and saves.

The step scored is the run's newest, or the kept step `config.restore_step`
names (0 = the newest). Scoring only reads the workdir: training with a
restore_step moves the newer steps aside, scoring never does. The results
name their step, and are saved as WORKDIR/eval_SPLIT.json, or as
eval_SPLIT_STEP.json for a restore_step, so that scoring an older step never
overwrites what the newest one scored.
"""

import json
from typing import Any, Dict

import jax
import ml_collections

from linformer_jax import storage
from linformer_jax.training import run_loading


def evaluate_run(config: ml_collections.ConfigDict, workdir: str, split: str) -> Dict[str, Any]:
  """The task's metrics of workdir's step (see the module doc) on `split`,
  next to the task's references (a unigram model, the majority class), with
  the step, split and task.

  Raises:
    ConfigError: a bad config or split, no checkpoint (or no kept
      config.restore_step) in workdir, or a workdir of another model.
  """
  workdir = storage.location(workdir)
  config = ml_collections.ConfigDict(config.to_dict())
  config.data.eval_split = split
  loaded = run_loading.load_run(config, workdir, with_data=True)
  return {
      'step': loaded.step,
      'split': split,
      'task': loaded.parts.task.name,
      **loaded.evaluate(),
      **loaded.parts.task.reference_results(loaded.data),
  }


def results_path(config: ml_collections.ConfigDict, workdir: str, split: str) -> str:
  """WORKDIR/eval_SPLIT.json, or eval_SPLIT_STEP.json for config.restore_step=STEP."""
  step = config.restore_step
  name = f'eval_{split}_{step}.json' if step else f'eval_{split}.json'
  return storage.join(storage.location(workdir), name)


def write_results(path: str, results: Dict[str, Any]) -> None:
  """Writes `results` to `path` (process 0) whole or not at all."""
  if jax.process_index() == 0:
    storage.write_text(path, json.dumps(results, indent=2, sort_keys=True))
