"""Sharding changes nothing but speed: meshes, cross-mesh restore, two processes, FSDP.

The multi-device checks (all `slow`) run tests/sharding_worker.py in
subprocesses with 8 fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8, set by the worker), since
a process's device count is fixed when JAX starts. The rest check, in this
process, how configs and logical axes become meshes and shardings.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from run_helpers import PORT_ATTEMPTS
from run_helpers import PORT_TAKEN
from run_helpers import free_port

from configs import tiny
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_config
from linformer_jax.training import sharding

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'sharding_worker.py')
# Data only, both axes, model only; (4, 2) is a restore target below.
MESHES = [(8, 1), (2, 4), (1, 8)]


def finish(process, log, timeout=400):
  try:
    process.wait(timeout=timeout)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  assert process.returncode == 0, log.read_text()[-4000:]


def load(root, name):
  with np.load(os.path.join(root, f'{name}.npz')) as data:
    return {key: data[key] for key in data.files}


def train_as_two_processes(run_python, root):
  """Runs the worker's `process` jobs: process 0 coordinates, process 1 joins.

  Their output goes to files: a pipe read only after the other process ends
  could fill up and stall the two, which wait for each other.
  """
  for attempt in range(PORT_ATTEMPTS):
    port = free_port()
    logs = [root / f'process_{index}_attempt_{attempt}.log' for index in range(2)]
    processes = [
        run_python(WORKER, 4, root, f'process:{index}:2:{port}', wait=False, log=logs[index])
        for index in range(2)
    ]
    try:
      coordinator_failed = processes[0].wait(timeout=400) != 0
      if coordinator_failed and PORT_TAKEN in logs[0].read_text():
        continue  # process 1, waiting for a coordinator, is stopped below
      assert not coordinator_failed, logs[0].read_text()[-4000:]
      assert processes[1].wait(timeout=400) == 0, logs[1].read_text()[-4000:]
      return
    finally:
      for process in processes:
        if process.poll() is None:
          process.kill()
          process.wait()
  raise AssertionError(
      f'{PORT_ATTEMPTS} free ports in a row were taken before the '
      f'coordinator could bind them; see {root}/process_0_*.log'
  )


@pytest.fixture(scope='module')
def runs(tmp_path_factory, run_python):
  """Every worker job, side by side where one does not need another's output:
  most of their time is single-threaded compilation, so two cores run them in
  about half the time."""
  root = tmp_path_factory.mktemp('sharding')

  def start(name, devices, *jobs):
    log = root / f'{name}.log'
    return run_python(WORKER, devices, root, *jobs, wait=False, log=log), log

  meshes = [f'train:{d},{m}' for d, m in MESHES]
  eight = start('eight_devices', 8, *meshes, 'restore:mesh_2_4:4,2', 'merged:2')
  one = start('one_device', 1, 'train:1,1')
  # FSDP on mesh (8, 1), compared with the replicated train:8,1 above; its
  # checkpoint restored replicated; the step's argument bytes per device
  # without and with it.
  fsdp = start('fsdp', 8, 'fsdp:8,1', 'restore:fsdp_8_1:8,1', 'memory:8,1')
  try:
    train_as_two_processes(run_python, root)
  finally:
    finish(*eight)
    finish(*one)
    finish(*fsdp)
  finish(*start('restore_onto_one_device', 1, 'restore:mesh_2_4:1,1'))
  return root


def assert_params_close(first, second, rtol):
  keys = sorted(k for k in first if k.startswith('param:'))
  assert keys == sorted(k for k in second if k.startswith('param:'))
  for key in keys:
    np.testing.assert_allclose(first[key], second[key], rtol=rtol, atol=1e-7, err_msg=key)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize('mesh', MESHES)
def test_every_mesh_trains_like_one_device(runs, mesh):
  single = load(runs, 'train_1_1')
  sharded = load(runs, f'train_{mesh[0]}_{mesh[1]}')
  np.testing.assert_array_equal(sharded['loss_steps'], [1, 2, 3])
  np.testing.assert_allclose(sharded['losses'], single['losses'], rtol=1e-5)
  assert_params_close(sharded, single, rtol=1e-5)


@pytest.mark.long
@pytest.mark.slow
def test_the_model_axis_really_splits_parameters(runs):
  # Attention and MLP weights are split model-axis ways; the rest replicated.
  assert load(runs, 'train_1_1')['shard_counts'].max() == 1
  assert load(runs, 'train_8_1')['shard_counts'].max() == 1
  assert load(runs, 'train_2_4')['shard_counts'].max() == 4
  assert load(runs, 'train_1_8')['shard_counts'].max() == 8


@pytest.mark.long
@pytest.mark.slow
def test_a_checkpoint_restores_onto_other_meshes(runs):
  saved = load(runs, 'train_2_4')
  onto_4_2 = load(runs, 'restore_mesh_2_4_to_4_2')
  onto_one = load(runs, 'restore_mesh_2_4_to_1_1')
  assert onto_4_2['shard_counts'].max() == 2
  assert_params_close(onto_4_2, saved, rtol=0)
  assert_params_close(onto_one, saved, rtol=0)


@pytest.mark.long
@pytest.mark.slow
def test_fsdp_trains_like_replicated_parameters(runs):
  replicated = load(runs, 'train_8_1')
  fsdp = load(runs, 'fsdp_8_1')
  np.testing.assert_array_equal(fsdp['loss_steps'], [1, 2, 3])
  np.testing.assert_allclose(fsdp['losses'], replicated['losses'], rtol=1e-6)
  assert_params_close(fsdp, replicated, rtol=1e-5)
  assert replicated['shard_counts'].max() == 1
  assert fsdp['shard_counts'].max() == 8


@pytest.mark.long
@pytest.mark.slow
def test_an_fsdp_checkpoint_restores_replicated(runs):
  restored = load(runs, 'restore_fsdp_8_1_to_8_1')
  assert restored['shard_counts'].max() == 1
  assert_params_close(restored, load(runs, 'fsdp_8_1'), rtol=0)


@pytest.mark.long
@pytest.mark.slow
def test_fsdp_divides_the_arguments_per_device_by_the_data_axis(runs):
  # Parameters, optimizer state and the batch share: all but the few small
  # parameters with no dimension that divides 8 (biases over heads x 4 head
  # features, the 260-id output bias) are split 8 ways.
  memory = load(runs, 'memory_8_1')
  ratio = memory['arguments_fsdp_False'] / memory['arguments_fsdp_True']
  assert 6 < ratio <= 8, ratio


@pytest.mark.long
@pytest.mark.slow
def test_two_processes_train_like_one(runs):
  reference = load(runs, 'merged')
  processes = load(runs, 'processes')
  np.testing.assert_array_equal(processes['loss_steps'], [1, 2, 3])
  np.testing.assert_allclose(processes['losses'], reference['losses'], rtol=1e-5)
  assert_params_close(processes, reference, rtol=1e-5)


# Bad input, checked before anything is compiled.


@pytest.mark.parametrize(
    'mesh_shape,devices,expected',
    [((8, 1), 8, (8, 1)), ((-1, 2), 8, (4, 2)), ((2, -1), 8, (2, 4)), ((-1, 1), 1, (1, 1))],
)
def test_mesh_shape_resolves_minus_one(mesh_shape, devices, expected):
  assert sharding.resolve_mesh_shape(mesh_shape, devices) == expected


@pytest.mark.parametrize(
    'mesh_shape,devices,message',
    [
        ((4, 4), 8, 'needs 16 devices but there are 8'),
        ((3, -1), 8, '8 devices do not divide'),
        ((-1, -1), 8, 'more than one -1'),
        ((8,), 8, 'two positive ints'),
        ((0, 8), 8, 'two positive ints'),
    ],
)
def test_bad_mesh_shape_is_a_clear_error(mesh_shape, devices, message):
  with pytest.raises(ConfigError, match='config.mesh_shape') as error:
    sharding.resolve_mesh_shape(mesh_shape, devices)
  assert message in str(error.value)


def small_model(**overrides):
  fields = dict(
      vocab_size=260,
      max_len=32,
      num_layers=2,
      num_heads=8,
      hidden_dim=32,
      mlp_dim=64,
      projected_len=8,
  )
  return ModelConfig(**{**fields, **overrides})


@pytest.mark.parametrize(
    'model,batch,field',
    [
        (dict(num_heads=2, hidden_dim=32), 8, 'config.model.num_heads=2'),
        (dict(mlp_dim=66), 8, 'config.model.mlp_dim=66'),
        ({}, 5, 'config.batch_size=5'),
    ],
)
def test_mesh_that_cannot_split_the_model_or_batch_is_an_error(model, batch, field):
  mesh = jax.sharding.AbstractMesh((2, 4), sharding.MESH_AXES)
  rules = sharding.axis_rules(tiny.get_config())
  with pytest.raises(ConfigError, match=field):
    sharding.check_divisibility(
        small_model(**model), mesh, rules, batch_size=batch, eval_batch_size=8
    )


def test_axis_rules_must_name_mesh_axes():
  config = tiny.get_config()
  config.axis_rules = (('heads', 'tensor'),)
  with pytest.raises(ConfigError, match="'tensor'"):
    sharding.axis_rules(config)


def model_shardings(mesh, **overrides):
  """The model's parameter shardings on `mesh`, by '/'-joined key path."""
  config = small_model(**overrides)
  boxed = jax.eval_shape(
      models.MaskedLanguageModel(config).init, jax.random.PRNGKey(0), jnp.ones((1, 32), jnp.int32)
  )
  shardings = sharding.parameter_shardings(boxed, mesh, sharding.axis_rules(tiny.get_config()))
  return {
      '/'.join(key.key for key in path): leaf.spec
      for path, leaf in jax.tree_util.tree_leaves_with_path(shardings)
  }


def test_a_vocabulary_that_does_not_divide_is_replicated():
  mesh = jax.sharding.AbstractMesh((1, 8), sharding.MESH_AXES)
  P = jax.sharding.PartitionSpec
  embedding = 'params/encoder/token_embedding/embedding'
  query = 'params/encoder/layers_0/attention/query/kernel'  # [embed, heads, head_dim]
  # 260 byte ids do not split 8 ways: the table is replicated, not refused.
  bytes_vocabulary = model_shardings(mesh, vocab_size=260)
  assert bytes_vocabulary[embedding] == P(None, None)
  assert bytes_vocabulary[query] == P(None, 'model', None)
  # 8000 ids do: the vocabulary axis is split over the model axis.
  divisible = model_shardings(mesh, vocab_size=8000)
  assert divisible[embedding] == P('model', None)
  assert divisible[query] == P(None, 'model', None)


def test_fsdp_splits_the_largest_free_dimension_over_data():
  P = jax.sharding.PartitionSpec
  mesh = jax.sharding.AbstractMesh((8, 1), sharding.MESH_AXES)
  config = small_model()
  boxed = jax.eval_shape(
      models.MaskedLanguageModel(config).init, jax.random.PRNGKey(0), jnp.ones((1, 32), jnp.int32)
  )
  rules = sharding.axis_rules(tiny.get_config())
  specs = {
      '/'.join(key.key for key in path): leaf.spec
      for path, leaf in jax.tree_util.tree_leaves_with_path(
          sharding.parameter_shardings(boxed, mesh, rules, fsdp=True)
      )
  }
  layer = 'params/encoder/layers_0/'
  # [embed=32, heads, head_dim]: the embedding width is the free dimension.
  assert specs[layer + 'attention/query/kernel'] == P('data', 'model', None)
  # [mlp=64] is split over 'model' already: nothing is left for 'data'.
  assert specs[layer + 'mlp/wi/bias'] == P('model')
  # [heads, head_dim=4]: 4 does not divide 8, so replicated over 'data'.
  assert specs[layer + 'attention/query/bias'] == P('model', None)
  assert specs['params/encoder/token_embedding/embedding'] == P('model', 'data')
  # Without fsdp, or with one data shard, nothing is split over 'data'.
  for fsdp, data in ((False, 8), (True, 1)):
    mesh = jax.sharding.AbstractMesh((data, 8 // data), sharding.MESH_AXES)
    for leaf in jax.tree_util.tree_leaves(
        sharding.parameter_shardings(boxed, mesh, rules, fsdp=fsdp)
    ):
      assert 'data' not in leaf.spec


def test_fsdp_must_be_a_bool():
  # A config read from JSON (configs/from_workdir.py) is not type-checked by ConfigDict.
  config = ml_collections.ConfigDict({**tiny.get_config().to_dict(), 'fsdp': 1})
  with pytest.raises(ConfigError, match='config.fsdp=1'):
    run_config.RunConfig.from_config(config)
