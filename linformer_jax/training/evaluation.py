"""A run's checkpoint scored on a split: what `linformer_jax.evaluate` prints and saves.

The step scored is the run's newest, or the kept step `config.restore_step`
names (0 = the newest). Scoring only reads the workdir: training with a
restore_step moves the newer steps aside, scoring never does. The results
name their step, and are saved as WORKDIR/eval_SPLIT.json, or as
eval_SPLIT_STEP.json for a restore_step, so that scoring an older step never
overwrites what the newest one scored.

A perplexity above `PERPLEXITY_LIMIT` describes no model, only a loss that
diverged: training reports it as inf (`bounded`), with a note saying so
(`perplexity_note`), and the results files, which are strict JSON, hold null.
"""

import math
from typing import Any, Dict, Optional

import jax
import ml_collections

from linformer_jax import storage
from linformer_jax.training import run_loading
from linformer_jax.training import tasks
from linformer_jax.training.metric_writers import json_text
from linformer_jax.training.run_config import LoopSettings

# A perplexity above this is reported as inf (`tasks.PERPLEXITY_LIMIT`): a loss
# above ln(1e30) = 69 nats a token, where a uniform guess over a million tokens
# costs 14, is a diverged model's, and exp(loss) tells nothing more.
PERPLEXITY_LIMIT = tasks.PERPLEXITY_LIMIT


def bounded(metrics: Dict[str, float]) -> Dict[str, float]:
  """`metrics` with a 'perplexity' above PERPLEXITY_LIMIT as inf."""
  if metrics.get('perplexity', 0.0) > PERPLEXITY_LIMIT:
    return {**metrics, 'perplexity': math.inf}
  return metrics


def perplexity_note(perplexity: Optional[float]) -> str:
  """What follows a line that shows a `bounded` perplexity: why it is inf."""
  if perplexity is None or not math.isinf(perplexity):
    return ''
  limit = f'{PERPLEXITY_LIMIT:.0e}'.replace('e+', 'e')
  return f' (a perplexity above {limit} means nothing: the loss diverged)'


def evaluate_run(config: ml_collections.ConfigDict, workdir: str, split: str) -> Dict[str, Any]:
  """The task's metrics of workdir's step (see the module doc) on `split`
  (`bounded`), next to the task's references (a unigram model, the majority
  class), with the step, split and task.

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
      **bounded(loaded.evaluate()),
      **loaded.parts.task.reference_results(loaded.data),
  }


def results_path(loop: LoopSettings, workdir: str, split: str) -> str:
  """WORKDIR/eval_SPLIT.json, or eval_SPLIT_STEP.json for config.restore_step=STEP
  (`loop.restore_step`)."""
  step = loop.restore_step
  name = f'eval_{split}_{step}.json' if step else f'eval_{split}.json'
  return storage.join(storage.location(workdir), name)


def write_results(path: str, results: Dict[str, Any]) -> None:
  """Writes `results` to `path` (process 0) whole or not at all, as strict
  JSON (a NaN or infinite value as null)."""
  if jax.process_index() == 0:
    storage.write_text(path, json_text(results, indent=2, sort_keys=True))
