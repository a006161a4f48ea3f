"""A run's kept checkpoint loaded without training it: for evaluation,
inference, the analyses and `linformer_jax.load`.

`load_run(config, workdir)` restores only the model's variables of a run's
newest checkpoint (or a kept step), with the run's tokenizer and, if asked,
its evaluation data: no optimizer, no training iterator. Every reader of a
finished run gets the one shape, `LoadedRun`. Loading only reads the
workdir: unlike training, which moves the steps after `config.restore_step`
aside, it leaves every step kept. A damaged newest step is skipped with a
one-line warning, and refused when asked for by number (`CheckpointStore`).
A run may still be training in the folder, removing its older steps as it
saves: a step removed while it is read is chosen again from the steps kept
then, with a one-line warning, and refused in one line when it was asked for
by number (`pruned_steps.retried_while_pruned`). The one file a reader may
write, a tokenizer trained again for a run whose tokenizer.model is gone,
stays only if the checkpoint was trained with it.
"""

import dataclasses
import types
from typing import Any, Dict, Optional, Tuple

import ml_collections

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints import pruned_steps
from linformer_jax.checkpoints import step_files
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.data import classification_sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import tasks

_OTHER_RUN_ADVICE = 'the workdir holds a run with a different model config; use another --workdir'


@dataclasses.dataclass(eq=False)
class LoadedRun:
  """A model with its variables: a run's kept checkpoint, or a fresh draw.

  Attributes:
    config: the run's config.
    parts: the run's task, model and mesh (`run_builder.RunParts`).
    variables: the model's variables: 'params' and, for fixed projections,
      'constants'.
    tokenizer: the run's tokenizer; None for ListOps, whose symbols are their
      own ids, and for a fresh draw whose tokenizer is trained on data.
    step: the checkpoint's step; 0 for a fresh draw.
    workdir: the run's folder; None for a fresh draw.
    data: this process's evaluation data (no training iterator), where it
      was loaded with `with_data=True`; else None.
  """

  config: ml_collections.ConfigDict
  parts: run_builder.RunParts
  variables: Dict[str, Any]
  tokenizer: Optional[tokenizer_lib.Tokenizer]
  step: int
  workdir: Optional[str]
  data: Any = None

  def evaluate(self) -> Dict[str, float]:
    """The task's metrics over all evaluation batches of `data`."""
    if self.data is None:
      raise ValueError('This run was loaded without data; load it with with_data=True.')
    eval_step = self.parts.jit_eval_step(self.parts.abstract_variables())
    return tasks.evaluate_batches(
        self.parts.task, eval_step, self.variables, self.data.eval_batches, self.parts.device_batch
    )


def load_run(
    config: ml_collections.ConfigDict,
    workdir: str,
    step: Optional[int] = None,
    *,
    with_data: bool = False,
) -> LoadedRun:
  """`workdir`'s newest checkpoint (or its kept `step`, else its kept
  config.restore_step) with the run's tokenizer, checked against the
  checkpoint's fingerprint, and with `with_data` the evaluation split of
  config.data (`data.eval_split`).

  The tokenizer is the run's own (WORKDIR/tokenizer.model, or bytes); without
  data nothing else is read.

  Raises:
    ConfigError: a bad config, no checkpoint (or no kept step) or tokenizer
      in workdir, or a workdir of another model or tokenizer; the step asked
      for was removed (by the run training there) while it was read.
  """
  parts = run_builder.build_parts(config)
  named = ''
  if step is None and parts.settings.loop.restore_step:
    step = parts.settings.loop.restore_step
    named = f'config.restore_step={step}: '
  abstract = parts.abstract_variables()
  wanted = step
  try:
    step, data_state, variables = pruned_steps.retried_while_pruned(
        lambda: _read_step(parts.settings, workdir, wanted, named, abstract), retry=wanted is None
    )
  except pruned_steps.StepPruned as pruned:
    what = f'{named}{pruned.what}' if named else step_files.capitalized(pruned.what)
    raise ConfigError(f'{what}; ask for one of them.') from None
  data = None
  # A tokenizer the data trains for a run that lost its own is kept only if
  # the checkpoint was trained with that very one.
  with storage.undone_if_refused():
    if with_data:
      data = parts.build_data(workdir, train=False)
      tokenizer = getattr(data, 'tokenizer', None)
      fingerprint = data
    else:
      tokenizer = None
      # A dataset with its own vocabulary (ListOps) has no tokenizer file.
      own_vocabulary = (
          parts.settings.task == 'classification'
          and classification_sources.source_of(parts.settings.data).own_vocab_size is not None
      )
      if not own_vocabulary:
        tokenizer = tokenizer_files.run_tokenizer(parts.settings.data, workdir)
      sha256 = tokenizer.sha256 if tokenizer else None
      fingerprint = types.SimpleNamespace(tokenizer=tokenizer, tokenizer_sha256=sha256)
    if isinstance(data_state, dict):
      run_builder.check_same_tokenizer(data_state, fingerprint, workdir)
  return LoadedRun(config, parts, variables, tokenizer, step, workdir, data)


def _read_step(
    settings: run_config.RunConfig,
    workdir: str,
    wanted: Optional[int],
    named: str,
    abstract: Dict[str, Any],
) -> Tuple[int, Any, Dict[str, Any]]:
  """The step `_newest_step` chooses, its data state and the model's
  variables there (shaped as `abstract`).

  Raises:
    StepPruned: the step was removed while it was read.
  """
  step, data_state = _newest_step(settings, workdir, wanted, named)
  # Its own listing, made after the run training there pruned `step`, no
  # longer holds it: the step was pruned, not asked for in vain.
  with pruned_steps.pruned_if_gone(run_folder.RunFolder(workdir).checkpoints, step):
    return step, data_state, _restore_variables(workdir, abstract, step)


def _newest_step(
    settings: run_config.RunConfig, workdir: str, wanted: Optional[int], named: str
) -> Tuple[int, Any]:
  """The newest intact step of workdir (warning about each newer damaged step
  it skips), or its kept step `wanted` (asked for as `named`, e.g.
  'config.restore_step=3: ', or ''), checked against the run's `settings`,
  and its data state. A damaged `wanted` is refused in a message that names
  what is wrong and the step to use instead."""
  with CheckpointStore(run_folder.RunFolder(workdir).checkpoints) as store:
    if not store.step_folders():
      raise ConfigError(f'{workdir} holds no checkpoint; train first or fix --workdir.')
    kept = store.all_steps()
    if wanted is not None and wanted not in kept:
      store.refuse_damaged(wanted, asked_as=named)
      raise ConfigError(
          f'{named}{workdir} keeps no checkpoint of step {wanted}; its kept steps are '
          f'{", ".join(map(str, kept)) or "none"} (0 = the newest).'
      )
    # The newest intact step, with a warning for each newer damaged one skipped.
    step = store.step_to_read(wanted)
    run_config.check_same_model(store.restore_config(step), settings, workdir)
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
