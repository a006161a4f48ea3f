"""A checkpoint's items as orbax stores them, and the check that its arrays
are the ones a run wants.

A checkpoint of one step holds three items (`store`): `state`, the train
state's arrays (orbax's standard pytree handler), and `data_state` and
`config`, JSON (`json_items`). `handler_registry` names each item's orbax
handlers up front, for saving, restoring the whole state, or restoring a part
of it. Before any array is read, `stored_and_wanted` lines the stored state's
array metadata up with the abstract arrays a caller asks for, and
`check_arrays_match` refuses any difference in one line that names the leaf:
orbax's own errors name neither the leaf nor the cause.

A step folder without an integrity manifest (`step_files`) has nothing to be
checked against; `unreadable_items` reads its items through once instead, as
orbax would restore them, so a truncated or missing file is found before the
step is used.
"""

import json
import os
from typing import Any, Dict, Optional, Tuple

import jax
import orbax.checkpoint as ocp
import tensorstore as ts

from linformer_jax import storage
from linformer_jax.errors import ConfigError

PyTree = Any

# The item folders of every checkpoint step.
STATE = 'state'
DATA_STATE = 'data_state'
CONFIG = 'config'
ITEMS = [STATE, DATA_STATE, CONFIG]
# The file orbax's JSON handler writes an item to.
_JSON_FILE = 'metadata'
# The state's JSON files beside its arrays: its tree (which every state has),
# its shardings, and (in this folder) each process's array metadata.
_STATE_TREE_FILE = '_METADATA'
_STATE_JSON_FILES = (_STATE_TREE_FILE, '_sharding')
_ARRAY_METADATA_FOLDER = 'array_metadatas'
# The root of the state's OCDBT array store.
_OCDBT_MANIFEST = 'manifest.ocdbt'


def handler_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """The orbax handler of each item.

  Registered up front, rather than learned from the first save, so that a
  store opened on an existing directory can read metadata and restore before
  it has saved anything. `PyTreeRestore` serves partial restores (params only).
  """
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  for args_type in (ocp.args.StandardSave, ocp.args.StandardRestore, ocp.args.PyTreeRestore):
    registry.add(STATE, args_type)
  for item in (DATA_STATE, CONFIG):
    registry.add(item, ocp.args.JsonSave)
    registry.add(item, ocp.args.JsonRestore)
  return registry


def stored_and_wanted(
    stored_tree: PyTree, abstract: PyTree, prefix: Tuple[str, ...]
) -> Tuple[Dict[Tuple[str, ...], Any], Dict[Tuple[str, ...], Any]]:
  """The checkpoint's array metadata under `prefix` and the arrays of
  `abstract` (placed at `prefix`), both flat: path -> leaf."""
  stored = {
      path: meta
      for path, meta in ocp.tree.to_flat_dict(stored_tree).items()
      if path[: len(prefix)] == prefix
  }
  wanted = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
    path = prefix + ocp.tree.str_keypath(keypath)
    if getattr(leaf, 'sharding', None) is None:
      raise ValueError(
          f'abstract leaf {"/".join(path)!r} has no sharding; pass '
          'jax.ShapeDtypeStruct leaves with sharding= set.'
      )
    wanted[path] = leaf
  return stored, wanted


def state_metadata(manager: ocp.CheckpointManager, step: int) -> PyTree:
  return manager.item_metadata(step)[STATE].tree


def _leaf_name(path: Tuple[str, ...]) -> str:
  return '/'.join(path)


def check_arrays_match(
    stored: Dict[Tuple[str, ...], Any],
    wanted: Dict[Tuple[str, ...], Any],
    *,
    directory: str,
    step: int,
    advice: str,
) -> None:
  """Raises ConfigError unless a checkpoint's arrays are exactly those wanted.

  Orbax's own errors for a mismatch name neither the leaf nor the cause, so
  shapes and structure are compared here, before anything is read.

  Args:
    stored: path -> array metadata (with `.shape`) of the checkpoint's arrays
      under the paths compared.
    wanted: path -> the `jax.ShapeDtypeStruct` wanted there.
    directory: the checkpoint directory, for the messages.
    step: the checkpoint's step, for the messages.
    advice: what the user should change, ending every message.
  """
  where = f'the checkpoint of step {step} in {directory}'
  for path, leaf in wanted.items():
    if path not in stored:
      raise ConfigError(
          f'{where} has no array {_leaf_name(path)!r} (expected shape '
          f'{tuple(leaf.shape)}): {advice}.'
      )
    stored_shape = tuple(stored[path].shape)
    if stored_shape != tuple(leaf.shape):
      raise ConfigError(
          f'{where} holds {_leaf_name(path)!r} with shape {stored_shape}, '
          f'but shape {tuple(leaf.shape)} was expected: {advice}.'
      )
  unexpected = sorted(set(stored) - set(wanted))
  if unexpected:
    raise ConfigError(
        f'{where} holds array {_leaf_name(unexpected[0])!r} that the '
        f'model does not have: {advice}.'
    )


def _unparsable(path: str) -> Optional[str]:
  """What keeps the JSON file at `path` from being read, or None."""
  try:
    json.loads(storage.read_text(path))
  except OSError as error:
    return f'it cannot be read ({error.strerror})'
  except ValueError as error:
    return f'it is not JSON ({error})'
  return None


def _unreadable_chunks(state_folder: str) -> Optional[str]:
  """The first array chunk of the state's OCDBT store that cannot be read
  (a truncated or missing data file), as 'KEY: REASON', or None. Reads one
  chunk at a time."""
  if storage.is_object_store(state_folder):
    base = f'{state_folder}/'
  else:
    base = {'driver': 'file', 'path': f'{os.path.abspath(state_folder)}/'}
  key = 'its index'
  try:
    store = ts.KvStore.open({'driver': 'ocdbt', 'base': base}).result()
    for key in store.list().result():
      # A chunk whose data file is gone reads as empty: no chunk or array
      # metadata orbax writes is.
      if not store.read(key).result().value:
        return f'{key.decode("utf-8", "replace")}: its data file is missing'
  except Exception as error:  # pylint: disable=broad-except
    # TensorStore's reason, without the source locations it appends.
    reason = str(error).splitlines()[0].split(' [source locations=')[0]
    name = key.decode('utf-8', 'replace') if isinstance(key, bytes) else key
    return f'{name}: {reason}'
  return None


def unreadable_items(step_folder: str) -> Optional[str]:
  """What keeps the items of a step folder from being restored, naming the
  first file or array chunk that cannot be read, or None. For steps without
  an integrity manifest: reads every item through once, as a manifest's
  check does."""
  for item in (DATA_STATE, CONFIG):
    problem = _unparsable(os.path.join(step_folder, item, _JSON_FILE))
    if problem:
      return f'{item}/{_JSON_FILE}: {problem}'
  state = os.path.join(step_folder, STATE)
  problem = _unparsable(os.path.join(state, _STATE_TREE_FILE))
  if problem:
    return f'{STATE}/{_STATE_TREE_FILE}: {problem}'
  for relative in storage.files_under(state):
    if relative in _STATE_JSON_FILES or relative.startswith(f'{_ARRAY_METADATA_FOLDER}/'):
      problem = _unparsable(os.path.join(state, relative))
      if problem:
        return f'{STATE}/{relative}: {problem}'
  if storage.exists(os.path.join(state, _OCDBT_MANIFEST)):
    problem = _unreadable_chunks(state)
    if problem:
      return f'{STATE}/ cannot be read ({problem})'
  return None
