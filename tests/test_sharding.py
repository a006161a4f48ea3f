"""Sharding changes nothing but speed: meshes, cross-mesh restore, two processes.

The multi-device checks run tests/sharding_worker.py in subprocesses with 8
fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), since a
process's device count is fixed when JAX starts.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import tiny
from linformer_jax.training import sharding
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, 'tests', 'sharding_worker.py')
MESHES = [(8, 1), (4, 2), (2, 4), (1, 8)]


def start_worker(devices, root, *jobs):
  env = {**os.environ, 'PYTHONPATH': REPO}
  env.pop('XLA_FLAGS', None)
  return subprocess.Popen([sys.executable, WORKER, str(devices), str(root), *jobs],
                          cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def finish(process, timeout=400):
  output, _ = process.communicate(timeout=timeout)
  assert process.returncode == 0, output[-4000:]


def load(root, name):
  with np.load(os.path.join(root, f'{name}.npz')) as data:
    return {key: data[key] for key in data.files}


def free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('sharding')
  finish(start_worker(8, root, *[f'train:{d},{m}' for d, m in MESHES],
                      'restore:mesh_4_2:2,4', 'merged:2'))
  finish(start_worker(1, root, 'train:1,1', 'restore:mesh_4_2:1,1'))
  port = free_port()
  processes = [start_worker(4, root, f'process:{i}:2:{port}') for i in range(2)]
  for process in processes:
    finish(process)
  return root


def assert_params_close(first, second, rtol):
  keys = sorted(k for k in first if k.startswith('param:'))
  assert keys == sorted(k for k in second if k.startswith('param:'))
  for key in keys:
    np.testing.assert_allclose(first[key], second[key], rtol=rtol, atol=1e-7,
                               err_msg=key)


@pytest.mark.parametrize('mesh', MESHES)
def test_every_mesh_trains_like_one_device(runs, mesh):
  single = load(runs, 'train_1_1')
  sharded = load(runs, f'train_{mesh[0]}_{mesh[1]}')
  np.testing.assert_array_equal(sharded['loss_steps'], [1, 2, 3])
  np.testing.assert_allclose(sharded['losses'], single['losses'], rtol=1e-5)
  assert_params_close(sharded, single, rtol=1e-5)


def test_the_model_axis_really_splits_parameters(runs):
  # Attention and MLP weights are split model-axis ways; the rest replicated.
  assert load(runs, 'train_1_1')['shard_counts'].max() == 1
  assert load(runs, 'train_8_1')['shard_counts'].max() == 1
  assert load(runs, 'train_2_4')['shard_counts'].max() == 4
  assert load(runs, 'train_1_8')['shard_counts'].max() == 8


def test_a_checkpoint_restores_onto_other_meshes(runs):
  saved = load(runs, 'train_4_2')
  onto_2_4 = load(runs, 'restore_mesh_4_2_to_2_4')
  onto_one = load(runs, 'restore_mesh_4_2_to_1_1')
  assert onto_2_4['shard_counts'].max() == 4
  assert_params_close(onto_2_4, saved, rtol=0)
  assert_params_close(onto_one, saved, rtol=0)


def test_two_processes_train_like_one(runs):
  reference = load(runs, 'merged')
  processes = load(runs, 'processes')
  np.testing.assert_array_equal(processes['loss_steps'], [1, 2, 3])
  np.testing.assert_allclose(processes['losses'], reference['losses'], rtol=1e-5)
  assert_params_close(processes, reference, rtol=1e-5)


# Bad input, checked before anything is compiled.

@pytest.mark.parametrize('mesh_shape,devices,expected', [
    ((8, 1), 8, (8, 1)), ((-1, 2), 8, (4, 2)), ((2, -1), 8, (2, 4)),
    ((-1, 1), 1, (1, 1))])
def test_mesh_shape_resolves_minus_one(mesh_shape, devices, expected):
  assert sharding.resolve_mesh_shape(mesh_shape, devices) == expected


@pytest.mark.parametrize('mesh_shape,devices,message', [
    ((4, 4), 8, 'needs 16 devices but there are 8'),
    ((3, -1), 8, '8 devices do not divide'),
    ((-1, -1), 8, 'more than one -1'),
    ((8,), 8, 'two positive ints'),
    ((0, 8), 8, 'two positive ints')])
def test_bad_mesh_shape_is_a_clear_error(mesh_shape, devices, message):
  with pytest.raises(ConfigError, match='config.mesh_shape') as error:
    sharding.resolve_mesh_shape(mesh_shape, devices)
  assert message in str(error.value)


def small_model(**overrides):
  fields = dict(vocab_size=260, max_len=32, num_layers=2, num_heads=8, hidden_dim=32,
                mlp_dim=64, projected_len=8)
  return ModelConfig(**{**fields, **overrides})


@pytest.mark.parametrize('model,batch,field', [
    (dict(num_heads=2, hidden_dim=32), 8, 'config.model.num_heads=2'),
    (dict(mlp_dim=66), 8, 'config.model.mlp_dim=66'),
    ({}, 5, 'config.batch_size=5')])
def test_mesh_that_cannot_split_the_model_or_batch_is_an_error(model, batch, field):
  mesh = jax.sharding.AbstractMesh((2, 4), sharding.MESH_AXES)
  rules = sharding.axis_rules(tiny.get_config())
  with pytest.raises(ConfigError, match=field):
    sharding.check_divisibility(small_model(**model), mesh, rules,
                                batch_size=batch, eval_batch_size=8)


def test_axis_rules_must_name_mesh_axes():
  config = tiny.get_config()
  config.axis_rules = (('heads', 'tensor'),)
  with pytest.raises(ConfigError, match="'tensor'"):
    sharding.axis_rules(config)


def test_a_vocabulary_that_does_not_divide_is_replicated():
  mesh = jax.sharding.AbstractMesh((1, 8), sharding.MESH_AXES)
  spec = jax.sharding.PartitionSpec('model', None)
  P = jax.sharding.PartitionSpec
  assert sharding._fits(spec, (260, 32), mesh) == P(None, None)
  assert sharding._fits(spec, (8000, 32), mesh) == P('model', None)
