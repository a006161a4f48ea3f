"""Parts of another run's checkpoint, read without opening a store on it.

`restore_params` reads the parameters of a run's kept step (config.init_from
starts a run from them), and `restore_subtrees` chosen parts of its train
state, e.g. a pretraining run's encoder inside a classifier
(`training/fine_tuning.py`) or a run's variables for evaluation. Either takes
the other run's workdir or its checkpoint directory, skips damaged steps as
every reader does (`damaged_steps`), chooses the newest step again when the
one it chose is removed while it reads it (a run still training there,
`pruned_steps`), checks the stored arrays against the wanted ones before
reading any (`orbax_items`), and places them on the wanted shardings.
Nothing in the other run's folder is changed.
"""

import os
from typing import Any, Dict, Optional, Tuple

import orbax.checkpoint as ocp

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints import damaged_steps
from linformer_jax.checkpoints import orbax_items
from linformer_jax.checkpoints import pruned_steps
from linformer_jax.checkpoints import step_files
from linformer_jax.errors import ConfigError

PyTree = Any

_INIT_FROM_ADVICE = (
    'config.init_from points to a run with a different model '
    'config; make the model configs match or drop init_from'
)


def restore_params(
    directory_or_workdir: str, abstract_params: PyTree, step: Optional[int] = None
) -> PyTree:
  """Reads only the parameters of another run's checkpoint (for init_from).

  Args:
    directory_or_workdir: the other run's workdir or its checkpoint
      directory.
    abstract_params: the parameters' structure as `jax.ShapeDtypeStruct`
      leaves with `sharding` set.
    step: the step to read; the newest one when None.

  Returns:
    The parameters, placed on the shardings of abstract_params.

  Raises:
    ConfigError (a ValueError): no checkpoint there, or its parameters do
      not fit abstract_params.
  """
  restored = restore_subtrees(directory_or_workdir, {('params',): abstract_params}, step=step)
  return restored[('params',)]


def restore_subtrees(
    directory_or_workdir: str,
    subtrees: Dict[Tuple[str, ...], PyTree],
    step: Optional[int] = None,
    advice: str = _INIT_FROM_ADVICE,
) -> Dict[Tuple[str, ...], PyTree]:
  """Reads chosen parts of another run's train state, e.g. its encoder.

  Args:
    directory_or_workdir: the other run's workdir or its checkpoint
      directory.
    subtrees: path in the stored train state -> the structure wanted there
      as `jax.ShapeDtypeStruct` leaves with `sharding` set, e.g.
      {('params', 'encoder'): abstract_encoder_params}. Under each path the
      stored arrays must be exactly those wanted, with the same shapes;
      everything outside the paths is ignored.
    step: the step to read; the newest one when None.
    advice: what the user should change, ending every error message.

  Returns:
    path -> the restored arrays, placed on the wanted shardings.

  Raises:
    ConfigError (a ValueError): no checkpoint there, or an array is missing,
      extra or of another shape (the message names it).
    StepPruned (a ConfigError): `step` was removed while it was read.
  """
  directory = storage.location(os.fspath(directory_or_workdir))
  checkpoints = run_folder.RunFolder(directory).checkpoints
  step_files.refuse_file_at(checkpoints, 'its checkpoints')
  if storage.isdir(checkpoints):
    directory = checkpoints
  if not storage.isdir(directory):
    raise ConfigError(
        f'{directory_or_workdir} is not a run directory; '
        "config.init_from must name a finished run's workdir."
    )
  step_files.quiet_vanished_step_logs()
  restored = pruned_steps.retried_while_pruned(
      lambda: _restore_state(directory, subtrees, step, advice), retry=step is None
  )
  out = {}
  for path in subtrees:
    node = restored[orbax_items.STATE]
    for key in path:
      node = node[key]
    out[path] = node
  return out


def _restore_state(
    directory: str, subtrees: Dict[Tuple[str, ...], PyTree], step: Optional[int], advice: str
) -> Dict[str, Any]:
  """The parts `subtrees` of `step` (the newest intact one when None) in the
  checkpoint directory `directory`, as orbax restores them."""
  manager = pruned_steps.listed(
      lambda: ocp.CheckpointManager(
          directory,
          # Never saves, so it changes nothing; orbax's read_only mode would
          # print three warnings before any error message.
          options=ocp.CheckpointManagerOptions(create=False),
          handler_registry=orbax_items.handler_registry(),
      ),
      directory,
  )
  try:
    step = damaged_steps.StepInspector(directory, orbax_items.ITEMS).step_to_read(
        manager.all_steps(), step
    )
    with pruned_steps.pruned_if_gone(directory, step):
      metadata = orbax_items.state_metadata(manager, step)
      target: Dict[str, Any] = {}
      for path, abstract in subtrees.items():
        orbax_items.check_arrays_match(
            *orbax_items.stored_and_wanted(metadata, abstract, path),
            directory=directory,
            step=step,
            advice=advice,
        )
        node = target
        for key in path[:-1]:
          node = node.setdefault(key, {})
        node[path[-1]] = abstract
      return manager.restore(
          step,
          args=ocp.args.Composite(
              **{
                  orbax_items.STATE: ocp.args.PyTreeRestore(
                      item=target,
                      restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                      partial_restore=True,
                  ),
              }
          ),
      )
  finally:
    manager.close()
