"""Helpers for tests that run the training loop on configs/tiny.py, and for
tests of the commands' contract on bad input."""

import hashlib
import json
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np

from configs import tiny
from linformer_jax import run_folder
from linformer_jax import testing
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.data.data_config import DataConfig
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import training_run
from linformer_jax.training.metric_writers import read_metrics


def tiny_config(**overrides):
  config = tiny.get_config()
  for key, value in overrides.items():
    target = config
    *parents, field = key.split('.')
    for parent in parents:
      target = target[parent]
    target[field] = value
  return config


def typed(config):
  """A config file's ConfigDict as the layers below the command line take it:
  the typed `RunConfig`."""
  return run_config.RunConfig.from_config(config)


def data_config(**fields):
  """configs/tiny.py's config.data with `fields` changed, typed (`DataConfig`)."""
  config = tiny.get_config()
  config.data.update(fields)
  return DataConfig.of(run_config.complete(config).data, config.task)


def small_model_config(**overrides):
  """A ModelConfig of a 2-layer model, 8 wide, n = 16 and k = 4, vocabulary
  of 40, no dropout: model-level checks of parts, fast to compile
  (`linformer_jax.testing.small_config`, which extension authors use too)."""
  return testing.small_config(**overrides)


def file_hashes(folder):
  """Every file under `folder` -> its bytes' sha256: what a refused command
  must leave unchanged."""
  return {
      os.path.relpath(os.path.join(root, name), folder): hashlib.sha256(
          open(os.path.join(root, name), 'rb').read()
      ).hexdigest()
      for root, _, names in os.walk(folder)
      for name in names
  }


def final_params(workdir, config):
  run = training_run.TrainingRun(run_builder.build_parts(config), workdir)
  params = jax.tree_util.tree_map(np.asarray, run.state.params)
  run.store.close()
  return int(run.state.step), params


def losses_by_step(workdir):
  return {m['step']: m['train_loss'] for m in read_metrics(workdir) if 'train_loss' in m}


def tiny_flags(workdir):
  """The command-line flags of a run of configs/tiny.py in `workdir`."""
  return ['--config', 'configs/tiny.py', '--workdir', str(workdir)]


def wait_for_step(workdir, step, process, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert process.poll() is None, process.stdout.read()
    if os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
      if any(m['step'] >= step for m in read_metrics(workdir)):
        return
    time.sleep(0.2)
  raise AssertionError(f'the run never reached step {step}')


def latest_checkpoint(workdir):
  store = CheckpointStore(run_folder.RunFolder(workdir).checkpoints)
  try:
    return store.latest_step()
  finally:
    store.close()


def start_endless_run(run_command, workdir, checkpoint_every=100000):
  """Starts `train` on configs/tiny.py that logs every step and runs until
  stopped; returns the running process."""
  return run_command(
      'train',
      *tiny_flags(workdir),
      '--config.total_steps=100000',
      '--config.log_every=1',
      f'--config.checkpoint_every={checkpoint_every}',
      '--config.eval_every=100000',
      wait=False,
  )


# A two-process run picks a free port, then its coordinator binds it: in
# between another program may take it. The coordinator then fails at once
# (gRPC logs this line, then JAX raises or the process even crashes), and the
# launch is retried on a new port, at most this many times in all.
PORT_TAKEN = 'Failed to add port to server'
PORT_ATTEMPTS = 3


def free_port():
  """A port no program listens on now (it may be taken before it is used)."""
  with socket.socket() as s:
    s.bind(('', 0))
    return s.getsockname()[1]


def one_error_line(process: subprocess.CompletedProcess, *names: str) -> str:
  """Checks the contract for bad input: exit code 2, one non-empty line on
  stderr starting `error: ` and naming every one of `names`, no traceback in
  stdout or stderr. Returns the line."""
  output = process.stdout + process.stderr
  lines = [line for line in process.stderr.splitlines() if line.strip()]
  assert process.returncode == 2, output
  assert len(lines) == 1 and lines[0].startswith('error: '), output
  assert 'Traceback' not in output, output
  for name in names:
    assert name in lines[0], lines[0]
  return lines[0]


def folder_contents(folder):
  """Every file and folder below `folder`: relative path -> the file's
  sha256, or 'folder'; None when `folder` does not exist."""
  if not os.path.exists(folder):
    return None
  found = {}
  for root, folders, files in os.walk(folder):
    for name in folders:
      found[os.path.relpath(os.path.join(root, name), folder)] = 'folder'
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
  return found


def can_mount_privately():
  """Whether this kernel lets a test mount (a tmpfs, a read-only bind) in a
  private user and mount namespace (`unshare`)."""
  if shutil.which('unshare') is None:
    return False
  probe = subprocess.run(
      ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c',
       'mount -t tmpfs -o size=1m tmpfs /mnt'],
      capture_output=True,
      check=False,
  )  # fmt: skip
  return probe.returncode == 0


REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_forked_commands(cases, folder, env, read_only=(), timeout=900):
  """Runs `python -m linformer_jax.MODULE ARGS` for each case ({'module',
  'args', 'env'}), one after another in the repository root, each forked
  from one process that imported the libraries once (tests/command_runner.py);
  returns per case {'returncode', 'stdout', 'stderr', 'seconds'}. The
  `read_only` folders are bind-mounted read-only in a private mount namespace.
  """
  cases_path, results_path = (
      pathlib.Path(folder) / 'cases.json',
      pathlib.Path(folder) / 'results.json',
  )
  cases_path.write_text(json.dumps(list(cases)))
  command = [sys.executable, str(REPO_ROOT / 'tests' / 'command_runner.py')]
  command += [str(cases_path), str(results_path)]
  if read_only:
    mounts = ' && '.join(
        f'mount --bind {shlex.quote(p)} {shlex.quote(p)} && '
        f'mount -o remount,ro,bind {shlex.quote(p)}'
        for p in read_only
    )
    private = ['unshare', '--user', '--map-root-user', '--mount', 'bash', '-c']
    command = private + [f'{mounts} && exec "$@"', 'runner'] + command
  runner = subprocess.run(
      command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
  )
  assert runner.returncode == 0, runner.stdout + runner.stderr
  return json.loads(results_path.read_text())
