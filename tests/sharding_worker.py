"""Runs tiny trainings on a given number of (fake CPU) devices for test_sharding.

  python tests/sharding_worker.py DEVICES ROOT JOB [JOB ...]

JOB is `train:D,M` (train 3 steps on mesh (D, M) in ROOT/mesh_D_M),
`fsdp:D,M` (the same as `train`, with config.fsdp, in ROOT/fsdp_D_M),
`memory:D,M` (the step's per-device argument bytes on mesh (D, M) without
and with config.fsdp, to ROOT/memory_D_M.npz),
`restore:SRC:D,M` (restore the run in ROOT/SRC onto mesh (D, M)) or
`process:I:N:PORT` (process I of N of a multi-process run on mesh (-1, 1),
in ROOT/processes) or `merged:N` (one process reading the data as N processes
do, the reference for `process`). Each job writes ROOT/<job name>.npz with the train losses
by step and the parameters, gathered to the host.
"""

import json
import os
import sys

DEVICES = int(sys.argv[1])
os.environ['XLA_FLAGS'] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"
)
os.environ['JAX_PLATFORMS'] = 'cpu'
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# JAX reads XLA_FLAGS when it is first imported, so these imports come after.
# ruff: noqa: E402
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from configs import tiny
from linformer_jax import mesh_memory
from linformer_jax.data import masked_lm
from linformer_jax.training import multihost
from linformer_jax.training import run_builder
from linformer_jax.training import trainer
from linformer_jax.training import training_run
from linformer_jax.training.metric_writers import read_metrics

# pylint: enable=g-import-not-at-top,wrong-import-position


def sharded_config(mesh_shape, fsdp=False):
  """The tiny config with heads, MLP and batches that split 8 ways."""
  config = tiny.get_config()
  config.fsdp = fsdp
  config.total_steps = 3
  config.warmup_steps = 1
  config.log_every = 1
  config.eval_every = 3
  config.checkpoint_every = 3
  config.batch_size = 8
  config.eval_batch_size = 8
  config.model.num_heads = 8
  config.model.hidden_dim = 32
  config.model.mlp_dim = 64
  config.model.sharing = 'headwise'  # per-layer E and F: replicated by the rules
  config.mesh_shape = tuple(mesh_shape)
  return config


def flat_params(state):
  leaves = jax.tree_util.tree_leaves_with_path(state.params)
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}


def parse_mesh(text):
  return tuple(int(size) for size in text.split(','))


def write(root, name, params, losses=None, shardings=None):
  payload = {f'param:{key}': value for key, value in params.items()}
  if losses:
    payload['loss_steps'] = np.array(sorted(losses))
    payload['losses'] = np.array([losses[step] for step in sorted(losses)])
  if shardings:
    payload['shard_counts'] = np.array([shardings[key] for key in sorted(shardings)])
  np.savez(os.path.join(root, f'{name}.npz'), **payload)


def shard_counts(state):
  """How many distinct pieces each parameter is split into."""
  return {
      jax.tree_util.keystr(path): len(
          {
              tuple(map(str, index))
              for index in leaf.sharding.devices_indices_map(leaf.shape).values()
          }
      )
      for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)
  }


def train(root, mesh_shape, workdir_name, name, fsdp=False):
  config = sharded_config(mesh_shape, fsdp)
  workdir = os.path.join(root, workdir_name)
  trainer.train_and_evaluate(config, workdir)
  losses = (
      {m['step']: m['train_loss'] for m in read_metrics(workdir) if 'train_loss' in m}
      if jax.process_index() == 0
      else {}
  )
  run = training_run.TrainingRun(run_builder.build_parts(config), workdir)
  if jax.process_index() == 0:
    write(root, name, flat_params(run.state), losses, shard_counts(run.state))
  run.store.close()


def memory(root, mesh_shape, name):
  arguments = {
      f'arguments_fsdp_{fsdp}': mesh_memory.compile_step(
          sharded_config(mesh_shape, fsdp), mesh_shape
      ).argument_bytes
      for fsdp in (False, True)
  }
  np.savez(os.path.join(root, f'{name}.npz'), **arguments)


def restore(root, source, mesh_shape, name):
  config = sharded_config(mesh_shape)
  run = training_run.TrainingRun(run_builder.build_parts(config), os.path.join(root, source))
  assert int(run.state.step) == 3
  write(root, name, flat_params(run.state), shardings=shard_counts(run.state))
  run.store.close()


class MergedIterator:
  """Concatenates the batches of several process-local iterators, in order."""

  def __init__(self, iterators):
    self._iterators = iterators

  def __next__(self):
    batches = [next(iterator) for iterator in self._iterators]
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}

  def get_state(self) -> bytes:
    return json.dumps([iterator.get_state().decode() for iterator in self._iterators]).encode()

  def set_state(self, state: bytes) -> None:
    for iterator, part in zip(self._iterators, json.loads(state)):
      iterator.set_state(part.encode())


def read_as_processes(count):
  """Makes one process read the data as `count` processes would, merged.

  The global batch of a multi-process run is every process's rows; this
  builds exactly those batches in a single process, as the reference.
  """
  build = masked_lm.build_datasets

  def merged(config, workdir, process_index=0, process_count=1, train=True):
    del process_index, process_count
    parts = [build(config, workdir, index, count, train) for index in range(count)]
    eval_batches = [
        {
            key: np.concatenate([p.eval_batches[i][key] for p in parts])
            for key in parts[0].eval_batches[i]
        }
        for i in range(len(parts[0].eval_batches))
    ]
    return parts[0]._replace(
        train_iterator=(MergedIterator([p.train_iterator for p in parts]) if train else None),
        eval_batches=eval_batches,
    )

  masked_lm.build_datasets = merged


def main():
  root = sys.argv[2]
  for job in sys.argv[3:]:
    kind, *args = job.split(':')
    if kind == 'train':
      mesh = parse_mesh(args[0])
      train(root, mesh, f'mesh_{mesh[0]}_{mesh[1]}', f'train_{mesh[0]}_{mesh[1]}')
    elif kind == 'fsdp':
      mesh = parse_mesh(args[0])
      train(root, mesh, f'fsdp_{mesh[0]}_{mesh[1]}', f'fsdp_{mesh[0]}_{mesh[1]}', fsdp=True)
    elif kind == 'memory':
      mesh = parse_mesh(args[0])
      memory(root, mesh, f'memory_{mesh[0]}_{mesh[1]}')
    elif kind == 'restore':
      mesh = parse_mesh(args[1])
      restore(root, args[0], mesh, f'restore_{args[0]}_to_{mesh[0]}_{mesh[1]}')
    elif kind == 'merged':
      read_as_processes(int(args[0]))
      train(root, (-1, 1), 'merged', 'merged')
    elif kind == 'process':
      index, count, port = map(int, args)
      multihost.initialize(f'localhost:{port}', count, index, cpu_collectives='gloo')
      train(root, (-1, 1), 'processes', 'processes')
    else:
      raise ValueError(f'unknown job {job!r}')


if __name__ == '__main__':
  main()
