"""A run's kept checkpoint loaded without training it: for evaluation,
inference and the analyses.

`load_for_evaluation(config, workdir)` restores only the model's variables of
a run's newest checkpoint (or the kept step `config.restore_step` names), with
the evaluation data: no optimizer, no training iterator; `load_for_inference`
the same variables and the run's tokenizer, without data. Both build the run's
parts with `run_builder`. Loading only reads the workdir: unlike training,
which moves the steps after `config.restore_step` aside, it leaves every step
kept.
"""

import dataclasses
import types
from typing import Any, Dict, Optional, Tuple

import ml_collections

from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.checkpoints.store import checkpoint_directory
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import tasks

_OTHER_RUN_ADVICE = 'the workdir holds a run with a different model config; use another --workdir'


@dataclasses.dataclass
class EvaluationRun:
  """A run's newest checkpoint loaded for evaluation only.

  Attributes:
    parts: the run's parts.
    step: the checkpoint's step.
    variables: the model's restored variables (params and constants).
    data: this process's data, without a training iterator.
    eval_step: the jitted (variables, batch) -> loss sums.
  """

  parts: run_builder.RunParts
  step: int
  variables: Dict[str, Any]
  data: Any
  eval_step: Any

  def evaluate(self) -> Dict[str, float]:
    """The task's metrics over all evaluation batches."""
    return tasks.evaluate_batches(
        self.parts.task,
        self.eval_step,
        self.variables,
        self.data.eval_batches,
        self.parts.device_batch,
    )


def load_for_evaluation(config: ml_collections.ConfigDict, workdir: str) -> EvaluationRun:
  """The model variables of `workdir`'s newest checkpoint (or of its kept
  step config.restore_step) and the evaluation data.

  Raises:
    ConfigError: a bad config, no checkpoint (or no kept config.restore_step)
      in workdir, or a workdir of another model or tokenizer.
  """
  parts = run_builder.build_parts(config)
  step, data_state = _newest_step(config, workdir)
  data = parts.build_data(workdir, train=False)
  if isinstance(data_state, dict):
    run_builder.check_same_tokenizer(data_state, data, workdir)
  abstract = parts.abstract_variables()
  variables = _restore_variables(workdir, abstract, step)
  return EvaluationRun(
      parts=parts,
      step=step,
      variables=variables,
      data=data,
      eval_step=parts.jit_eval_step(abstract),
  )


def load_for_inference(
    config: ml_collections.ConfigDict, workdir: str, step: Optional[int] = None
) -> Tuple[run_builder.RunParts, int, Dict[str, Any], Optional[tokenizer_lib.Tokenizer]]:
  """(parts, step, variables, tokenizer) of `workdir`'s newest checkpoint (or
  its kept `step`, else its kept config.restore_step), with no data read: the
  tokenizer is the run's own (WORKDIR/tokenizer.model, or bytes), checked
  against the checkpoint's fingerprint; None for ListOps, whose symbols are
  their own ids.

  Raises:
    ConfigError: a bad config, no checkpoint (or no kept step) or tokenizer
      in workdir, or a workdir of another model or tokenizer.
  """
  parts = run_builder.build_parts(config)
  step, data_state = _newest_step(config, workdir, step)
  tokenizer = None
  if config.data.source != 'listops':
    tokenizer = tokenizer_files.run_tokenizer(config.data, workdir)
  if isinstance(data_state, dict):
    sha256 = tokenizer.sha256 if tokenizer else None
    fingerprint = types.SimpleNamespace(tokenizer=tokenizer, tokenizer_sha256=sha256)
    run_builder.check_same_tokenizer(data_state, fingerprint, workdir)
  variables = _restore_variables(workdir, parts.abstract_variables(), step)
  return parts, step, variables, tokenizer


def _newest_step(
    config: ml_collections.ConfigDict, workdir: str, wanted: Optional[int] = None
) -> Tuple[int, Any]:
  """The newest intact step of workdir, or its kept step `wanted` (else
  config.restore_step, 0 = the newest), checked against config, and its data
  state."""
  named = ''
  if wanted is None and config.restore_step:
    wanted = config.restore_step
    named = f'config.restore_step={wanted}: '
  with CheckpointStore(checkpoint_directory(workdir)) as store:
    step = store.latest_step()
    if step is None:
      raise ConfigError(f'{workdir} holds no checkpoint; train first or fix --workdir.')
    if wanted is not None and wanted not in store.all_steps():
      raise ConfigError(
          f'{named}{workdir} keeps no checkpoint of step {wanted}; its kept steps are '
          f'{", ".join(map(str, store.all_steps()))} (0 = the newest).'
      )
    step = step if wanted is None else wanted
    run_config.check_same_model(store.restore_config(step), config, workdir)
    return step, store.restore_data_state(step)


def _restore_variables(workdir: str, abstract: Dict[str, Any], step: int) -> Dict[str, Any]:
  """The model's variables ({'params': ..., other collections}) at `step`."""
  subtrees = {('params',): abstract['params']}
  for collection, variables in abstract.items():
    if collection != 'params':
      subtrees[('constants', collection)] = variables
  restored = partial_restore.restore_subtrees(
      workdir, subtrees, step=step, advice=_OTHER_RUN_ADVICE
  )
  return {path[-1]: value for path, value in restored.items()}
