"""Runs that are corrupted, killed, raced, or run out of disk.

Checkpoint damage is made by hand in a store's step folders (a truncated,
zeroed or bit-flipped data file, a missing metadata file, a stray folder) and
must never be restored: the run's own store moves it aside and resumes from
the newest intact step, exactly as an uninterrupted run would continue.

Full and read-only disks are real: the `slow` tests mount a small tmpfs (or a
read-only bind mount) in a private mount namespace (`unshare`), and are
skipped where the kernel does not allow that.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import final_params
from run_helpers import latest_checkpoint
from run_helpers import losses_by_step
from run_helpers import tiny_config
from run_helpers import wait_for_step

from linformer_jax import run_folder
from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints import step_files
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import trainer


def _state(value):
  return {'w': jnp.full((256,), value, jnp.float32), 'b': jnp.arange(3.0) + value}


def _abstract(state):
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
  )


@pytest.fixture
def two_steps(tmp_path):
  """WORKDIR/checkpoints holding steps 1 and 2, whose arrays are all 1s and
  2s; returns the checkpoint directory."""
  directory = str(tmp_path / 'run' / 'checkpoints')
  with CheckpointStore(directory, owner=True) as store:
    for step in (1, 2):
      store.save(step, state=_state(float(step)), data_state={'at': step}, config={'c': step})
  return directory


def _largest_array_file(step_folder):
  files = glob.glob(os.path.join(step_folder, 'state', '**', 'd', '*'), recursive=True)
  return max(files, key=os.path.getsize)


def _truncate(step_folder):
  path = _largest_array_file(step_folder)
  os.truncate(path, os.path.getsize(path) // 2)


def _zero(step_folder):
  path = _largest_array_file(step_folder)
  with open(path, 'r+b') as f:
    f.write(bytes(os.path.getsize(path)))


def _flip_one_bit(step_folder):
  path = _largest_array_file(step_folder)
  data = bytearray(open(path, 'rb').read())
  data[len(data) // 2] ^= 0x10
  with open(path, 'wb') as f:
    f.write(data)


def _remove(relative):
  return lambda step_folder: os.remove(os.path.join(step_folder, relative))


def _garbage_data_state(step_folder):
  with open(os.path.join(step_folder, 'data_state', 'metadata'), 'w') as f:
    f.write('{"utf8_bytes": garbage')


DAMAGE = {
    'truncated data file': _truncate,
    'zeroed data file': _zero,
    'one flipped bit': _flip_one_bit,
    'missing state/_METADATA': _remove(os.path.join('state', '_METADATA')),
    'missing config/metadata': _remove(os.path.join('config', 'metadata')),
    'garbage data-iterator state': _garbage_data_state,
}


@pytest.mark.parametrize('damage', list(DAMAGE))
def test_a_damaged_newest_step_is_moved_aside_and_the_intact_one_restored(
    two_steps, damage, caplog
):
  DAMAGE[damage](os.path.join(two_steps, '2'))
  with CheckpointStore(two_steps, owner=True) as store:
    assert store.latest_step() == 1
    step, state, data_state, config = store.restore(abstract_state=_abstract(_state(0.0)))
  assert (step, data_state, config) == (1, {'at': 1}, {'c': 1})
  np.testing.assert_array_equal(state['w'], np.full((256,), 1.0))
  moved = os.path.join(run_folder.RunFolder(os.path.dirname(two_steps)).damaged_checkpoints, '2')
  assert os.path.isdir(moved) and not os.path.exists(os.path.join(two_steps, '2'))
  warnings = [r.getMessage() for r in caplog.records if 'damaged' in r.getMessage()]
  assert len(warnings) == 1 and 'step 2' in warnings[0] and f'moved it to {moved}' in warnings[0]


def test_readers_skip_a_damaged_step_and_leave_it_where_it_is(two_steps, caplog):
  _flip_one_bit(os.path.join(two_steps, '2'))
  store = CheckpointStore(two_steps)
  assert store.latest_step() == 1 and store.latest_step() == 1
  (warning,) = [r.getMessage() for r in caplog.records if 'damaged' in r.getMessage()]
  assert 'step 2' in warning and 'sha256 mismatch' in warning
  assert warning.endswith('skipped it: step 1, the newest intact one, is read instead.')
  workdir = os.path.dirname(two_steps)
  params = partial_restore.restore_subtrees(workdir, {('w',): _abstract(_state(0.0))['w']})
  np.testing.assert_array_equal(params[('w',)], np.full((256,), 1.0))
  assert os.path.isdir(os.path.join(two_steps, '2'))
  with pytest.raises(
      ConfigError, match=r'step 2 .* is damaged \(.*sha256 mismatch\)\); use step 1, the newest'
  ):
    CheckpointStore(two_steps).restore(2, abstract_state=_abstract(_state(0.0)))


def test_stray_folders_are_ignored_with_a_warning_and_saving_goes_on(two_steps, caplog):
  os.makedirs(os.path.join(two_steps, '999'))
  os.makedirs(os.path.join(two_steps, 'notes'))
  with CheckpointStore(two_steps, owner=True) as store:
    assert store.latest_step() == 2
    store.save(3, state=_state(3.0), data_state={'at': 3}, config={'c': 3})
    store.wait()
    assert store.restore(abstract_state=_abstract(_state(0.0)))[0] == 3
  messages = ' '.join(r.getMessage() for r in caplog.records)
  assert 'Ignoring notes' in messages and 'step 999' in messages
  assert os.path.isdir(os.path.join(two_steps, 'notes'))
  assert os.path.isdir(os.path.join(os.path.dirname(two_steps), 'damaged_checkpoints', '999'))


def test_the_run_removes_an_unfinished_save_before_its_store_opens_and_readers_never_do(
    two_steps,
):
  """Removed in the constructor's own thread: a run refused just after opening
  its store leaves no background cleanup to race the interpreter's exit."""
  unfinished = os.path.join(two_steps, '3' + step_files.TMP_SUFFIX)
  shutil.copytree(os.path.join(two_steps, '2'), unfinished)
  CheckpointStore(two_steps).close()
  assert os.path.isdir(unfinished)
  store = CheckpointStore(two_steps, owner=True)
  assert not os.path.exists(unfinished)
  assert store.latest_step() == 2
  store.close()
  assert sorted(os.listdir(two_steps)) == ['1', '2']


def test_with_no_intact_step_left_the_run_says_so_and_keeps_every_folder(two_steps):
  _zero(os.path.join(two_steps, '1'))
  _truncate(os.path.join(two_steps, '2'))
  with pytest.raises(ConfigError, match=r'No intact checkpoint is left .* steps \[1, 2\]'):
    CheckpointStore(two_steps, owner=True)
  damaged = os.path.join(os.path.dirname(two_steps), 'damaged_checkpoints')
  assert sorted(os.listdir(damaged)) == ['1', '2']


def test_a_step_written_before_manifests_is_read_unverified(two_steps, caplog):
  os.remove(os.path.join(two_steps, '2', step_files.MANIFEST_FILE))
  with CheckpointStore(two_steps, owner=True) as store:
    assert store.restore(abstract_state=_abstract(_state(0.0)))[0] == 2
  assert any('read unverified' in r.getMessage() for r in caplog.records)


def test_the_manifest_covers_every_item_file(two_steps):
  folder = os.path.join(two_steps, '2')
  with open(os.path.join(folder, step_files.MANIFEST_FILE)) as f:
    files = json.load(f)['files']
  on_disk = {
      os.path.relpath(os.path.join(root, name), folder)
      for item in ('state', 'data_state', 'config')
      for root, _, names in os.walk(os.path.join(folder, item))
      for name in names
  }
  assert set(files) == on_disk
  assert all(files[name]['bytes'] == os.path.getsize(os.path.join(folder, name)) for name in files)


@pytest.mark.slow
def test_a_run_resumes_exactly_from_the_newest_intact_checkpoint(tmp_path):
  """Damage to the two newest of three checkpoints costs the steps after the
  oldest, which are taken again to the same losses and parameters."""
  config = tiny_config(
      total_steps=12, log_every=1, eval_every=100, checkpoint_every=4, keep_checkpoints=3
  )
  workdir = str(tmp_path / 'run')
  trainer.train_and_evaluate(config, workdir)
  losses = losses_by_step(workdir)
  _, params = final_params(workdir, config)
  checkpoints = run_folder.RunFolder(workdir).checkpoints
  _flip_one_bit(os.path.join(checkpoints, '12'))
  _remove(os.path.join('state', '_METADATA'))(os.path.join(checkpoints, '8'))
  results = trainer.train_and_evaluate(config, workdir)
  assert results['step'] == 12
  assert losses_by_step(workdir) == losses
  assert sorted(os.listdir(os.path.join(workdir, 'damaged_checkpoints'))) == ['12', '8']
  _, resumed = final_params(workdir, config)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, resumed)


@pytest.mark.long
@pytest.mark.slow
def test_a_run_killed_during_its_saves_resumes_exactly(tmp_path, run_command):
  """SIGKILL while a checkpoint is written every step (so orbax's temporary
  folder almost always exists), then the same run to the end: the losses and
  parameters are those of a run never interrupted."""
  config = tiny_config(total_steps=12, log_every=1, eval_every=100, checkpoint_every=1)
  straight = str(tmp_path / 'straight')
  trainer.train_and_evaluate(config, straight)
  workdir = str(tmp_path / 'killed')
  flags = [f'--config.{name}={config[name]}' for name in ('log_every', 'eval_every')]
  process = run_command(
      'train',
      '--config',
      'configs/tiny.py',
      '--workdir',
      workdir,
      '--config.total_steps=12',
      '--config.checkpoint_every=1',
      *flags,
      wait=False,
  )
  wait_for_step(workdir, 6, process)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert latest_checkpoint(workdir) is not None
  trainer.train_and_evaluate(config, workdir)
  assert not glob.glob(os.path.join(workdir, 'checkpoints', f'*{step_files.TMP_SUFFIX}'))
  assert losses_by_step(workdir) == losses_by_step(straight)
  _, params = final_params(straight, config)
  _, resumed = final_params(workdir, config)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, resumed)


def _can_mount_privately():
  if shutil.which('unshare') is None:
    return False
  probe = subprocess.run(
      ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c',
       'mount -t tmpfs -o size=1m tmpfs /mnt'],
      capture_output=True,
      check=False,
  )  # fmt: skip
  return probe.returncode == 0


needs_private_mounts = pytest.mark.skipif(
    not _can_mount_privately(), reason='this kernel does not allow private tmpfs mounts'
)


def _in_private_mounts(script, repo_root, timeout=300):
  """Runs a bash script in a private mount namespace; $TRAIN runs the train
  command. Returns the completed process."""
  env = {
      **os.environ,
      'PYTHONPATH': str(repo_root),
      'JAX_PLATFORMS': 'cpu',
      'TRAIN': f'{sys.executable} -m linformer_jax.train --config configs/tiny.py',
      'PYTHON': sys.executable,
  }
  command = ['unshare', '--user', '--map-root-user', '--mount', 'bash', '-c']
  # A session of its own, so that a timeout stops every process it started.
  process = subprocess.Popen(
      [*command, textwrap.dedent(script)],
      cwd=repo_root,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )
  try:
    stdout, stderr = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    raise
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _one_error_line(output):
  assert 'Traceback' not in output, output
  errors = [line for line in output.splitlines() if line.startswith('error:')]
  assert len(errors) == 1, output
  return errors[0]


def _files_left(folder):
  return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]


@pytest.mark.long
@needs_private_mounts
@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_it_resumes_once_there_is_room(
    tmp_path, repo_root
):
  disk = tmp_path / 'disk'
  result = _in_private_mounts(
      f"""
      mkdir -p {disk} && mount -t tmpfs -o size=3m tmpfs {disk}
      $TRAIN --workdir {disk}/run --config.total_steps=24 --config.checkpoint_every=2 \\
          --config.keep_checkpoints=50 > {tmp_path}/full.txt 2>&1
      echo $? > {tmp_path}/full.rc
      find {disk} -type f -size 0 > {tmp_path}/empty.txt
      find {disk} -name '*orbax-checkpoint-tmp*' > {tmp_path}/temporary.txt
      mount -o remount,size=64m {disk}
      $TRAIN --workdir {disk}/run --config.total_steps=24 --config.checkpoint_every=2 \\
          --config.keep_checkpoints=50 > {tmp_path}/resumed.txt 2>&1
      echo $? > {tmp_path}/resumed.rc
      """,
      repo_root,
  )
  assert result.returncode == 0, result.stderr
  full = (tmp_path / 'full.txt').read_text()
  assert (tmp_path / 'full.rc').read_text().strip() == '2', full
  error = _one_error_line(full)
  assert 'the disk is full' in error and 'MB free' in error and f'{disk}/run' in error
  assert (tmp_path / 'empty.txt').read_text() == ''
  assert (tmp_path / 'temporary.txt').read_text() == ''
  resumed = (tmp_path / 'resumed.txt').read_text()
  assert (tmp_path / 'resumed.rc').read_text().strip() == '0', resumed
  assert 'Resumed from the checkpoint of step' in resumed


@pytest.mark.long
@needs_private_mounts
@pytest.mark.slow
def test_a_save_failing_in_the_background_is_reported_at_once(tmp_path, repo_root):
  """With the space check before each save defeated, orbax itself meets the
  full disk in its background thread: the run stops at the next step with
  one line, and removes the failed step's temporary folder. Only the
  checkpoints are on the small disk (WORKDIR/checkpoints is a link to it)."""
  disk = tmp_path / 'disk'
  workdir = tmp_path / 'run'
  workdir.mkdir()
  os.symlink(disk, workdir / 'checkpoints')
  script = tmp_path / 'train_without_space_check.py'
  script.write_text(textwrap.dedent(f"""
          import runpy, sys
          from linformer_jax.checkpoints import full_disk
          if __name__ == '__main__':  # Data preparation's workers import this file.
            full_disk.room_shortfall = lambda *args: None
            sys.argv = ['train', '--config', 'configs/tiny.py', '--workdir', '{workdir}',
                        '--config.total_steps=600', '--config.checkpoint_every=50',
                        '--config.log_every=1', '--config.keep_checkpoints=50']
            runpy.run_module('linformer_jax.train', run_name='__main__')
          """))
  result = _in_private_mounts(
      f"""
      mkdir -p {disk} && mount -t tmpfs -o size=3m tmpfs {disk}
      $PYTHON {script} > {tmp_path}/out.txt 2>&1
      echo $? > {tmp_path}/rc
      find {disk} -type f -size 0 > {tmp_path}/empty.txt
      find {disk} -name '*orbax-checkpoint-tmp*' > {tmp_path}/temporary.txt
      """,
      repo_root,
  )
  assert result.returncode == 0, result.stderr
  output = (tmp_path / 'out.txt').read_text()
  assert (tmp_path / 'rc').read_text().strip() == '2', output
  error = [line for line in output.splitlines() if line.startswith('error:')]
  assert len(error) == 1 and 'Cannot save the checkpoint of step' in error[0], output
  failed_step = int(error[0].split('Cannot save the checkpoint of step ')[1].split()[0])
  steps = [json.loads(line)['step'] for line in open(workdir / 'metrics.jsonl')]
  # Reported as soon as it failed, long before the next save was due.
  assert max(steps) < failed_step + 50
  assert (tmp_path / 'empty.txt').read_text() == ''
  assert (tmp_path / 'temporary.txt').read_text() == ''


@needs_private_mounts
@pytest.mark.slow
def test_a_disk_full_before_the_first_write_leaves_no_empty_files(tmp_path, repo_root):
  disk = tmp_path / 'disk'
  result = _in_private_mounts(
      f"""
      mkdir -p {disk} && mount -t tmpfs -o size=1m tmpfs {disk}
      mkdir {disk}/run && head -c 2000000 /dev/zero > {disk}/filler 2>/dev/null
      $TRAIN --workdir {disk}/run > {tmp_path}/out.txt 2>&1
      echo $? > {tmp_path}/rc
      find {disk}/run -type f > {tmp_path}/files.txt
      """,
      repo_root,
  )
  assert result.returncode == 0, result.stderr
  output = (tmp_path / 'out.txt').read_text()
  assert (tmp_path / 'rc').read_text().strip() == '2', output
  assert 'the disk is full' in _one_error_line(output)
  assert (tmp_path / 'files.txt').read_text() == ''


@needs_private_mounts
@pytest.mark.slow
def test_a_read_only_workdir_is_one_line(tmp_path, repo_root):
  workdir = tmp_path / 'read_only'
  workdir.mkdir()
  result = _in_private_mounts(
      f"""
      mount --bind {workdir} {workdir} && mount -o remount,ro,bind {workdir}
      $TRAIN --workdir {workdir} > {tmp_path}/out.txt 2>&1
      echo $? > {tmp_path}/rc
      """,
      repo_root,
  )
  assert result.returncode == 0, result.stderr
  output = (tmp_path / 'out.txt').read_text()
  assert (tmp_path / 'rc').read_text().strip() == '2', output
  assert f"--workdir='{workdir}' is not writable" in _one_error_line(output)
  assert _files_left(workdir) == []


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['a file', 'empty'])
def test_a_workdir_that_cannot_be_a_folder_is_one_line(tmp_path, run_command, kind):
  workdir = ''
  if kind == 'a file':
    workdir = tmp_path / 'file'
    workdir.write_text('not a folder')
  result = run_command('train', '--config=configs/tiny.py', f'--workdir={workdir}')
  assert result.returncode == 2, result.stderr
  assert 'cannot be a run folder' in _one_error_line(result.stderr)
  assert sorted(os.listdir(tmp_path)) == (['file'] if kind == 'a file' else [])


@pytest.mark.long
@pytest.mark.slow
def test_init_from_a_run_of_another_size_prints_only_the_error_line(tmp_path, run_command):
  pretrained = str(tmp_path / 'pretrained')
  trainer.train_and_evaluate(tiny_config(total_steps=2, warmup_steps=1), pretrained)
  result = run_command(
      'train',
      '--config=configs/tiny.py',
      f'--workdir={tmp_path / "run"}',
      f'--config.init_from={pretrained}',
      '--config.model.hidden_dim=64',
  )
  assert result.returncode == 2, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and 'config.init_from points to a run' in lines[0], result.stderr
  assert not os.path.exists(tmp_path / 'run')
