"""CheckpointStore: exact round trips, retention, shardings and clear errors."""

import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints.store import CheckpointStore

SHARDING = jax.sharding.SingleDeviceSharding(jax.devices()[0])
DATA_STATE = b'{"next_index": 12, "worker_count": 0}'
CONFIG = {'seed': 3, 'model': {'hidden_dim': 8, 'sharing': 'layerwise'}, 'betas': [0.9, 0.98]}


@flax.struct.dataclass
class State:
  """Shaped like the trainer's train state: a pytree with named fields."""

  step: jax.Array
  params: dict
  opt_state: optax.OptState
  constants: dict


def make_state(step=7, hidden=8):
  """A state whose values differ from step to step."""
  keys = jax.random.split(jax.random.PRNGKey(step), 3)
  params = {
      'dense': {'kernel': jax.random.normal(keys[0], (4, hidden)), 'bias': jnp.zeros((hidden,))},
      'embed': jax.random.normal(keys[1], (5, 4)).astype(jnp.bfloat16),
  }
  # Weight decay masked to matrices, as in training, gives empty optax nodes.
  optimizer = optax.adamw(1e-3, mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim > 1, p))
  opt_state = optimizer.init(params)
  # One update makes the moments non-zero, so restoring them is tested.
  _, opt_state = optimizer.update(params, opt_state, params)
  return State(
      step=jnp.asarray(step, jnp.int32),
      params=params,
      opt_state=(opt_state, optax.adamw(1e-3).init(params)),
      constants={'projection': {'E': jax.random.normal(keys[2], (6, 3))}},
  )


def abstract(tree, sharding=SHARDING):
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
  )


def assert_bitwise_equal(expected, actual):
  assert jax.tree_util.tree_structure(expected) == jax.tree_util.tree_structure(actual)
  for want, got in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(actual)):
    assert want.dtype == got.dtype and want.shape == got.shape
    assert np.asarray(want).tobytes() == np.asarray(got).tobytes()


def save_steps(directory, steps, **kwargs):
  with CheckpointStore(directory, **kwargs) as store:
    for step in steps:
      assert store.save(step, state=make_state(step), data_state=DATA_STATE, config=CONFIG)


def test_round_trip_is_bitwise_exact(tmp_path):
  state = make_state()
  with CheckpointStore(str(tmp_path)) as store:
    assert store.latest_step() is None
    assert store.save(7, state=state, data_state=DATA_STATE, config=CONFIG)
  with CheckpointStore(str(tmp_path)) as store:
    step, restored, data_state, config = store.restore(abstract_state=abstract(state))
  assert step == 7
  assert isinstance(restored, State)
  assert_bitwise_equal(state, restored)
  assert data_state == DATA_STATE and isinstance(data_state, bytes)
  assert config == CONFIG


def test_a_relative_directory_works(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  state = make_state()
  with CheckpointStore(os.path.join('run', 'checkpoints')) as store:
    assert store.save(3, state=state, data_state=DATA_STATE, config=CONFIG)
  with CheckpointStore(str(tmp_path / 'run' / 'checkpoints')) as store:
    assert store.latest_step() == 3
  params = partial_restore.restore_params('run', abstract(state).params)
  assert_bitwise_equal(state.params, params)


def test_dict_data_state_comes_back_as_a_dict(tmp_path):
  data_state = {'epoch': 1, 'shard_positions': [3, 0, 5]}
  with CheckpointStore(str(tmp_path), async_save=False) as store:
    store.save(1, state=make_state(1), data_state=data_state, config=CONFIG)
    assert store.restore(1, abstract_state=abstract(make_state()))[2] == data_state


def test_restore_places_arrays_on_the_requested_sharding(tmp_path):
  save_steps(str(tmp_path), [2])
  device = jax.devices()[-1]
  sharding = jax.sharding.SingleDeviceSharding(device)
  with CheckpointStore(str(tmp_path)) as store:
    _, restored, _, _ = store.restore(2, abstract_state=abstract(make_state(), sharding))
  for leaf in jax.tree_util.tree_leaves(restored):
    assert isinstance(leaf, jax.Array) and leaf.sharding == sharding


def test_keep_two_keeps_the_two_newest(tmp_path):
  save_steps(str(tmp_path), [1, 2, 3, 4], keep=2)
  with CheckpointStore(str(tmp_path), keep=2) as store:
    assert store.all_steps() == [3, 4]
    assert store.latest_step() == 4
  assert sorted(name for name in os.listdir(tmp_path) if name.isdigit()) == ['3', '4']


def test_async_save_then_wait_then_latest_step(tmp_path):
  with CheckpointStore(str(tmp_path), async_save=True) as store:
    assert store.save(5, state=make_state(5), data_state=DATA_STATE, config=CONFIG)
    # A second save of the same step, even one still in flight, is skipped.
    assert not store.save(5, state=make_state(5), data_state=DATA_STATE, config=CONFIG, force=True)
    store.wait()
    assert store.latest_step() == 5
  assert CheckpointStore(str(tmp_path)).latest_step() == 5


def test_opening_a_store_creates_nothing(tmp_path):
  directory = tmp_path / 'workdir' / 'checkpoints'
  with CheckpointStore(str(directory)) as store:
    assert store.latest_step() is None
  assert not (tmp_path / 'workdir').exists()


def test_shape_mismatch_names_the_leaf_and_both_shapes(tmp_path):
  save_steps(str(tmp_path), [3])
  other_model = abstract(make_state(hidden=16))
  with CheckpointStore(str(tmp_path)) as store:
    with pytest.raises(ValueError) as error:
      store.restore(abstract_state=other_model)
  message = str(error.value)
  assert '\n' not in message
  assert 'dense/bias' in message or 'dense/kernel' in message
  assert '(8,)' in message or '(4, 8)' in message
  assert '--workdir' in message


def test_restore_without_a_checkpoint_is_a_value_error(tmp_path):
  with CheckpointStore(str(tmp_path)) as store:
    with pytest.raises(ValueError, match='holds no checkpoint'):
      store.restore(abstract_state=abstract(make_state()))


def test_restore_config_reads_only_the_config(tmp_path):
  save_steps(str(tmp_path), [1, 2])
  with CheckpointStore(str(tmp_path)) as store:
    assert store.restore_config() == CONFIG
    assert store.restore_config(1) == CONFIG


def test_restore_params_takes_the_params_of_another_run(tmp_path):
  other_workdir = tmp_path / 'other'
  save_steps(str(other_workdir / 'checkpoints'), [4, 9])
  wanted = make_state(9).params
  for location in (other_workdir, other_workdir / 'checkpoints'):
    params = partial_restore.restore_params(str(location), abstract(wanted))
    assert_bitwise_equal(wanted, params)
    assert all(leaf.sharding == SHARDING for leaf in jax.tree_util.tree_leaves(params))
  older = partial_restore.restore_params(str(other_workdir), abstract(wanted), step=4)
  assert_bitwise_equal(make_state(4).params, older)


def test_restore_params_errors(tmp_path):
  with pytest.raises(ValueError, match='holds no checkpoint'):
    partial_restore.restore_params(str(tmp_path), abstract(make_state().params))
  save_steps(str(tmp_path / 'checkpoints'), [1])
  with pytest.raises(ValueError, match='init_from'):
    partial_restore.restore_params(str(tmp_path), abstract(make_state(hidden=16).params))
