"""Checkpoints of a training run, written and read with orbax.

Orbax is imported only here, in `orbax_items` (each item's handlers, the
check of stored arrays against the wanted ones) and in `partial_restore`
(parts of another run's checkpoint, read without a store). A checkpoint of
one step holds three items:

* `state`: the train state (parameters, optimizer state, step, constants), a
  pytree of arrays restored onto whatever shardings the caller asks for, so a
  run can resume on a different device mesh than the one that saved it;
* `data_state`: the training data iterator's position, stored as JSON;
* `config`: the run's config, stored as JSON so that a workdir can be checked
  against the requested model before anything else is built.

Every step folder is sealed with a manifest of its files' sizes and sha256
(`step_files`), written just before orbax renames it into place, and
checked before the step is read: a damaged step is never restored. The run that
owns the folder moves damaged steps aside and continues from the newest intact
one; readers skip them, with one warning each. A damaged step asked for by
number is refused in one message saying what is wrong and what to do
(`damaged_steps`). A step removed while a reader reads it (the run training
in the folder keeps only its newest steps) is chosen again, or refused when
asked for by number (`pruned_steps.retried_while_pruned`). A save that would
not fit on the disk, or that meets a full disk, stops the run with one line
(`full_disk`); a file where the checkpoint folder belongs is refused before
orbax meets it.

A step can be protected (`protect`), so that it outlives the newest `keep`:
the run protects its newest checkpoint from before a loss spike
(`training/divergence.py`). The mark is a file in the step folder, beside the
manifest, so a resumed run keeps honouring it. `go_back_to` resumes from an
older step by moving the newer ones to WORKDIR/diverged_checkpoints.

Every method must be called on all processes: orbax coordinates the hosts and
writes shared files once.
"""

import dataclasses
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from absl import logging
import jax
import orbax.checkpoint as ocp

from linformer_jax import storage
from linformer_jax.checkpoints import damaged_steps
from linformer_jax.checkpoints import full_disk
from linformer_jax.checkpoints import json_items
from linformer_jax.checkpoints import orbax_items
from linformer_jax.checkpoints import pruned_steps
from linformer_jax.checkpoints import step_files
from linformer_jax.errors import StorageError
from linformer_jax.errors import is_disk_full

PyTree = Any
DataState = json_items.DataState

_OTHER_WORKDIR_ADVICE = (
    'the workdir holds a run with a different model config; use another --workdir'
)


@dataclasses.dataclass
class _ProtectedSteps(ocp.checkpoint_managers.PreservationPolicy):
  """Orbax's preservation policy for the protected steps: a set the store
  changes while the manager runs."""

  steps: Set[int]

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
    del context
    return [checkpoint.step in self.steps for checkpoint in checkpoints]


class CheckpointStore:
  """The checkpoints of one run: the newest `keep` steps in `directory`.

  Nothing is created on disk until the first save, so opening a store on a
  workdir (to look for a checkpoint) leaves it untouched.
  """

  def __init__(
      self, directory: str, *, keep: int = 3, async_save: bool = True, owner: bool = False
  ):
    """Opens (without creating) the checkpoint directory of a run.

    Args:
      directory: the run's checkpoint directory, `WORKDIR/checkpoints`.
      keep: how many of the newest checkpoints to keep (at least 1).
      async_save: write checkpoints in a background thread; `save` returns
        once the arrays are copied to host memory.
      owner: this store belongs to the run that holds the workdir's lock: it
        removes orbax's temporary folders of interrupted saves and moves step
        folders newer than the newest intact checkpoint to
        WORKDIR/damaged_checkpoints (warning about each), so the run resumes
        from the newest intact one.

    Raises:
      ConfigError: a file is where the checkpoint directory belongs; (owner)
        step folders were found but none is intact; they were moved aside.
    """
    if keep < 1:
      raise ValueError(f'keep={keep}: a checkpoint store must keep at least 1 checkpoint.')
    # Orbax writes through TensorStore, which needs an absolute path.
    self.directory = storage.location(os.fspath(directory))
    self._async_save = async_save
    self._saving: Optional[int] = None
    self._failed = False
    self._inspector = damaged_steps.StepInspector(self.directory, orbax_items.ITEMS)
    step_files.refuse_file_at(self.directory, 'its checkpoints')
    full_disk.quiet_disk_full_logs()
    step_files.quiet_vanished_step_logs()
    if owner:
      step_files.remove_temporary_folders(self.directory)
      damaged_steps.set_aside_damaged_steps(self._inspector)
    self._protected = _ProtectedSteps(step_files.protected_steps(self.directory))
    options = ocp.CheckpointManagerOptions(
        create=False,
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(
            [ocp.checkpoint_managers.LatestN(n=keep), self._protected]
        ),
        # Saves are always asynchronous in orbax, so that every step is sealed
        # by the callback; `async_save=False` waits for each save instead.
        enable_async_checkpointing=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=self._seal),
        # Done above in this thread: orbax's own cleanup runs in a thread that
        # nothing waits for when a run is refused right after this.
        cleanup_tmp_directories=False,
    )
    self._manager = pruned_steps.listed(
        lambda: ocp.CheckpointManager(
            self.directory, options=options, handler_registry=orbax_items.handler_registry()
        ),
        self.directory,
    )

  def _seal(self) -> None:
    """Orbax's post-finalization callback (primary process, every item
    written, before the rename): writes the step's integrity manifest."""
    step = self._saving
    folder = step_files.temporary_folder(self.directory, step)
    if not storage.isdir(folder):  # Storage where orbax writes in place (gs://).
      folder = os.path.join(self.directory, str(step))
    step_files.write_manifest(folder)

  def __enter__(self) -> 'CheckpointStore':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _readable(self, step: int) -> bool:
    """Whether `step` is intact; a step removed since it was listed is not."""
    try:
      return self._inspector.inspection(step).problem is None
    except pruned_steps.StepPruned:
      return False

  def latest_step(self) -> Optional[int]:
    """The newest intact step (possibly still being written), or None; warns
    once, in one line, about each newer damaged step it skips."""
    return self._inspector.newest_intact(self._manager.all_steps())

  def all_steps(self) -> List[int]:
    """The kept intact steps in increasing order, including one still being
    written."""
    return sorted(step for step in self._manager.all_steps() if self._readable(step))

  def step_folders(self) -> List[int]:
    """Every step that has a folder, intact or damaged, in increasing order."""
    return sorted(self._manager.all_steps())

  def step_to_read(self, step: Optional[int] = None) -> int:
    """`step`, or the newest intact one when None, warning once about each
    newer damaged step skipped.

    Raises:
      ConfigError: `step` is damaged or not kept, or no step is intact.
    """
    return self._inspector.step_to_read(self._manager.all_steps(), step)

  def refuse_damaged(self, step: int, *, asked_as: str = '') -> None:
    """Raises ConfigError when `step`, asked for by number, is damaged: in
    place, or moved to WORKDIR/damaged_checkpoints by the run that owns the
    folder. The message (after `asked_as`, e.g. 'config.restore_step=3: ')
    names the first bad file, what is wrong with it and the step to use
    instead. Returns when the step is intact or was never kept: the caller
    says that in its own words."""
    self._inspector.refuse_damaged(self._manager.all_steps(), step, asked_as)

  def protected_steps(self) -> List[int]:
    """The kept steps that outlive the newest `keep`, in increasing order."""
    return sorted(set(self._protected.steps) & set(self.all_steps()))

  def protect(self, step: int) -> None:
    """Keeps the checkpoint of `step` (a kept one) until `unprotect`, in this
    run and the ones that resume it; orbax removes no protected step."""
    self._protected.steps.add(step)
    step_files.mark_protected(self.directory, step, True)

  def unprotect(self, step: int) -> None:
    """Lets the newest-`keep` rule remove `step` again (at the next save)."""
    self._protected.steps.discard(step)
    step_files.mark_protected(self.directory, step, False)

  def go_back_to(self, step: int) -> List[int]:
    """Makes the kept `step` the newest: moves every newer step folder to
    WORKDIR/diverged_checkpoints/from_STEP/ (nothing is deleted), so the run
    resumes from `step` and saves its later steps anew. Returns the steps
    moved. Only the run that holds the workdir's lock may call it."""
    self.wait()
    newer = sorted(kept for kept in self._manager.all_steps() if kept > step)
    step_files.move_diverged_steps(self.directory, newer, step)
    for kept in newer:
      self._inspector.forget(kept)
      self._protected.steps.discard(kept)
    self._manager.reload()
    return newer

  def save(
      self,
      step: int,
      *,
      state: PyTree,
      data_state: DataState,
      config: Dict[str, Any],
      force: bool = False,
  ) -> bool:
    """Saves a checkpoint of `step` unless one exists; returns whether it did.

    With asynchronous saving this returns once the arrays are on the host, so
    the caller may update or donate `state` right away; `wait` blocks until
    the checkpoint is on disk.

    Args:
      step: the training step.
      state: pytree of jax arrays (the train state).
      data_state: the data iterator's state: bytes of UTF-8 text (grain's
        `get_state()`) or a JSON-serializable dict.
      config: the run's config as a JSON-serializable dict.
      force: save even if orbax's save policy would skip this step (it skips
        steps not newer than the latest one).
    """
    step = int(step)
    # Orbax raises for a step that exists, even one still being written; a
    # second save of a step (e.g. the final one after a periodic one) is a no-op.
    if step in self._manager.all_steps():
      return False
    # Orbax waits for the previous save to finish before starting this one,
    # so at most one step is being sealed at a time.
    self.wait()
    step_files.refuse_file_at(self.directory, 'its checkpoints')
    self._check_space(step, state)
    self._saving = step
    self._inspector.trusted.add(step)
    items = ocp.args.Composite(
        **{
            orbax_items.STATE: ocp.args.StandardSave(state),
            orbax_items.DATA_STATE: ocp.args.JsonSave(json_items.encode_data_state(data_state)),
            orbax_items.CONFIG: ocp.args.JsonSave(json_items.json_copy(config, 'config')),
        }
    )
    saved = self._surfacing_full_disk(lambda: self._manager.save(step, args=items, force=force))
    if not self._async_save:
      self.wait()
    return saved

  def restore(
      self, step: Optional[int] = None, *, abstract_state: PyTree
  ) -> Tuple[int, PyTree, DataState, Dict[str, Any]]:
    """Restores a checkpoint onto the shardings of `abstract_state`.

    Args:
      step: the step to restore; the newest one when None.
      abstract_state: the train state's structure as `jax.ShapeDtypeStruct`
        leaves with `sharding` set; the restored arrays get these shapes,
        dtypes and shardings, and the same pytree types.

    Returns:
      (step, state, data_state, config), data_state in the type it was saved.

    Raises:
      ConfigError (a ValueError): no such checkpoint, or its arrays do not fit
        abstract_state (the one-line message names the first leaf that
        differs, both shapes and what to change).
      StepPruned (a ConfigError): `step` was removed while it was read.
    """
    self.wait()
    step = self.step_to_read(step)
    with pruned_steps.pruned_if_gone(self.directory, step):
      metadata = orbax_items.state_metadata(self._manager, step)
      orbax_items.check_arrays_match(
          *orbax_items.stored_and_wanted(metadata, abstract_state, ()),
          directory=self.directory,
          step=step,
          advice=_OTHER_WORKDIR_ADVICE,
      )
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
              **{
                  orbax_items.STATE: ocp.args.StandardRestore(abstract_state),
                  orbax_items.DATA_STATE: ocp.args.JsonRestore(),
                  orbax_items.CONFIG: ocp.args.JsonRestore(),
              }
          ),
      )
    return (
        step,
        restored[orbax_items.STATE],
        json_items.decode_data_state(restored[orbax_items.DATA_STATE]),
        restored[orbax_items.CONFIG],
    )

  def restore_config(self, step: Optional[int] = None) -> Dict[str, Any]:
    """The config saved with a checkpoint (the newest when step is None)."""
    return self._restore_json(orbax_items.CONFIG, step)

  def restore_data_state(self, step: Optional[int] = None) -> DataState:
    """The data state saved with a checkpoint (the newest when step is None)."""
    return json_items.decode_data_state(self._restore_json(orbax_items.DATA_STATE, step))

  def _restore_json(self, item: str, step: Optional[int]) -> Any:
    """One JSON item of `step`, or of the newest intact step when None, then
    chosen again while the one chosen is removed before it is read.

    Raises:
      StepPruned (a ConfigError): `step` was removed while it was read.
    """
    self.wait()

    def read() -> Any:
      chosen = self.step_to_read(step)
      with pruned_steps.pruned_if_gone(self.directory, chosen):
        restored = self._manager.restore(
            chosen, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()})
        )
      return restored[item]

    return pruned_steps.retried_while_pruned(read, retry=step is None, relist=self._relist)

  def _relist(self) -> None:
    """Lists the step folders again (orbax keeps the list it read)."""
    pruned_steps.listed(self._manager.reload, self.directory)

  def _check_space(self, step: int, state: PyTree) -> None:
    """StorageError, before anything is written, if the next checkpoint will
    not fit on the disk."""
    needed = full_disk.room_shortfall(self.directory, self._manager.all_steps(), state)
    if needed is not None:
      raise StorageError(
          full_disk.full_disk_message(
              self.directory, step, self.all_steps(), f'it needs about {needed / 1e6:.1f} MB'
          )
      )

  def _surfacing_full_disk(self, call):
    """Runs an orbax call; a full disk becomes a StorageError, once, after
    removing the failed step's temporary folder."""
    if self._failed:
      return None
    try:
      return call()
    except Exception as error:  # pylint: disable=broad-except
      if not is_disk_full(error):
        raise
      self._failed = True
      if jax.process_index() == 0 and self._saving is not None:
        shutil.rmtree(step_files.temporary_folder(self.directory, self._saving), ignore_errors=True)
      self._inspector.forget(self._saving)
      raise StorageError(
          full_disk.full_disk_message(self.directory, self._saving, self.all_steps())
      ) from None

  def check_for_errors(self) -> None:
    """Raises StorageError at once if a background save failed on a full
    disk (any other failure is re-raised); cheap enough for every step."""
    # Orbax's own finalize thread takes the background error first, and gives
    # it back only from wait_until_finished, which returns at once when no
    # save is in flight.
    if not self._manager.is_saving_in_progress():
      self.wait()

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._surfacing_full_disk(self._manager.wait_until_finished)

  def close(self) -> None:
    """Waits for pending saves and releases orbax's resources."""
    if self._failed:
      try:
        self._manager.close()
      except Exception:  # pylint: disable=broad-except
        logging.exception('Closing the checkpoints after a failed save.')
      return
    self.wait()
    self._manager.close()
