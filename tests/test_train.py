"""The real training loop on tiny settings: results, exact resume, signals, errors.

In-process runs check results, metrics, checkpoints and exact resume; the
`slow` tests run `python -m linformer_jax.train` and `.evaluate` as a user
would, for signals, one-line errors and refused workdirs.
"""

import hashlib
import json
import os
import shutil
import signal
import time

import jax
import numpy as np
import pytest
from run_helpers import final_params
from run_helpers import latest_checkpoint
from run_helpers import losses_by_step
from run_helpers import start_endless_run
from run_helpers import tiny_config
from run_helpers import tiny_flags
from run_helpers import wait_for_step

from linformer_jax import run_folder
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import trainer
from linformer_jax.training import training_run
from linformer_jax.training import workdir_lock
from linformer_jax.training.metric_writers import read_metrics


@pytest.fixture(scope='module')
def finished_run(tiny_run):
  return tiny_run


def test_a_tiny_run_writes_results_metrics_events_and_checkpoints(finished_run):
  workdir, results = finished_run
  assert results['step'] == 20
  assert np.isfinite(results['eval_perplexity']) and results['eval_perplexity'] > 1
  with open(os.path.join(workdir, 'eval_results.json')) as f:
    assert json.load(f)['eval_loss'] == pytest.approx(results['eval_loss'])
  metrics = read_metrics(workdir)
  assert [m['step'] for m in metrics if 'train_loss' in m] == [5, 10, 15, 20]
  assert [m['step'] for m in metrics if 'eval_perplexity' in m] == [10, 20]
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(workdir))
  assert CheckpointStore(run_folder.RunFolder(workdir).checkpoints).latest_step() == 20
  # The loss went down from its start at about log(vocab).
  first, last = metrics[0]['train_loss'], results['eval_loss']
  assert last < first


def test_a_finished_run_started_again_says_so_and_trains_nothing(finished_run, tmp_path, capsys):
  workdir = tmp_path / 'run'
  shutil.copytree(finished_run[0], workdir)
  checkpoints_before = snapshot(run_folder.RunFolder(str(workdir)).checkpoints)
  metrics_before = read_metrics(str(workdir))
  results = trainer.train_and_evaluate(tiny_config(), str(workdir))
  printed = capsys.readouterr().out
  assert f'the run in {workdir} is finished at step 20 (total_steps=20)' in printed
  assert 'nothing to train' in printed
  assert 'training steps' not in printed and 'compiled' not in printed
  assert results['step'] == 20
  assert results['eval_loss'] == pytest.approx(finished_run[1]['eval_loss'], rel=1e-5)
  assert read_metrics(str(workdir)) == metrics_before
  assert snapshot(run_folder.RunFolder(str(workdir)).checkpoints) == checkpoints_before


# `make test` checks exact resumption through
# test_reliability.py::test_a_run_resumes_exactly_from_the_newest_intact_checkpoint.
@pytest.mark.long
@pytest.mark.slow
def test_resume_is_exact(tmp_path):
  config = tiny_config(total_steps=12, log_every=1, eval_every=6, checkpoint_every=100)
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  trainer.train_and_evaluate(config, straight)
  assert trainer.train_and_evaluate(config, resumed, stop_after=6) is None
  assert CheckpointStore(run_folder.RunFolder(resumed).checkpoints).latest_step() == 6
  trainer.train_and_evaluate(config, resumed)
  assert losses_by_step(straight) == losses_by_step(resumed)
  assert sorted(losses_by_step(resumed)) == list(range(1, 13))
  step_a, params_a = final_params(straight, config)
  step_b, params_b = final_params(resumed, config)
  assert step_a == step_b == 12
  jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)


@pytest.mark.long
@pytest.mark.slow
def test_one_run_per_workdir_and_a_dead_runs_lock_never_blocks(tmp_path, run_command):
  """A second run on a busy workdir exits 2 with one line naming it; once the
  first is killed, the workdir's lock is free at once."""
  workdir = str(tmp_path / 'run')
  first = start_endless_run(run_command, workdir)
  wait_for_step(workdir, 2, first)
  first.send_signal(signal.SIGSTOP)  # it keeps its lock, and leaves the cores to the others
  second = run_command('train', *tiny_flags(workdir))
  errors = [line for line in second.stderr.splitlines() if line.startswith('error:')]
  assert second.returncode == 2, second.stderr
  assert len(errors) == 1 and f'{workdir} is in use by another run' in errors[0]
  # A run's first line names the backend it found.
  assert second.stdout.splitlines()[0] == 'backend cpu: 1 device (cpu), 1 process'
  with pytest.raises(ConfigError, match='is in use by another run'):
    with workdir_lock.exclusive_workdir(workdir):
      pass
  first.kill()
  first.wait()
  with workdir_lock.exclusive_workdir(workdir):
    pass


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['sigterm', 'ctrl-c'])
def test_sigterm_and_ctrl_c_save_a_checkpoint_before_exiting(tmp_path, run_command, signum):
  """Saved, waited for, exit 143 or 130 with one line and no traceback or
  temporary folder; the run resumes bitwise as if never stopped."""
  workdir = str(tmp_path / 'run')
  process = start_endless_run(run_command, workdir)
  wait_for_step(workdir, 3, process)
  process.send_signal(signum)
  assert process.wait(timeout=120) == 128 + signum
  output = process.stdout.read()  # stderr goes to stdout too
  assert 'Traceback' not in output, output
  name = 'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'
  assert sum(f'{name} received' in line for line in output.splitlines()) == 1, output
  assert not [f for f in os.listdir(os.path.join(workdir, 'checkpoints')) if 'tmp' in f]
  saved = CheckpointStore(run_folder.RunFolder(workdir).checkpoints).latest_step()
  assert saved is not None and saved >= 3
  assert saved == max(m['step'] for m in read_metrics(workdir))
  if signum == signal.SIGINT:
    config = tiny_config(
        total_steps=100000, log_every=1, checkpoint_every=100000, eval_every=100000
    )
    trainer.train_and_evaluate(config, workdir, stop_after=saved + 2)
    straight = str(tmp_path / 'straight')
    trainer.train_and_evaluate(config, straight, stop_after=saved + 2)
    assert losses_by_step(workdir) == losses_by_step(straight)


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_resumes_from_the_last_checkpoint(tmp_path, run_command):
  workdir = str(tmp_path)
  config = tiny_config(total_steps=100000, log_every=1, checkpoint_every=4, eval_every=100000)
  process = start_endless_run(run_command, workdir, checkpoint_every=4)
  wait_for_step(workdir, 10, process)
  # Checkpoints are written asynchronously: wait until one is complete on disk.
  deadline = time.time() + 120
  while latest_checkpoint(workdir) is None and time.time() < deadline:
    time.sleep(0.2)
  process.kill()
  process.wait()
  saved = latest_checkpoint(workdir)
  assert saved is not None and saved % 4 == 0 and saved >= 4
  trainer.train_and_evaluate(config, workdir, stop_after=saved + 2)
  steps = [m['step'] for m in read_metrics(workdir) if 'train_loss' in m]
  # Steps after the checkpoint were lost and taken again, once each.
  assert steps == list(range(1, saved + 3))


@pytest.mark.long
@pytest.mark.slow
def test_a_non_finite_step_is_never_saved_and_the_kept_checkpoint_resumes(tmp_path):
  """The guard checks parameters, not only the loss.

  The learning rate is 0 on step 1 (one warm-up step), then a weight decay so
  large that step 2's update overflows every weight matrix to inf while step
  2's loss, computed before the update, is still finite. Saving every step,
  only step 1 may be kept; resuming from it with a sane weight decay trains on.
  """
  workdir = str(tmp_path)
  config = tiny_config(
      max_skipped_steps=0,  # stop at the first non-finite step
      learning_rate=1e6,
      warmup_steps=1,
      weight_decay=1e35,
      grad_clip_norm=0.0,
      checkpoint_every=1,
      log_every=1,
      total_steps=20,
  )
  with pytest.raises(trainer.NonFiniteLossError, match='step 2 the parameters'):
    trainer.train_and_evaluate(config, workdir)
  sane = tiny_config(
      learning_rate=1e-3,
      warmup_steps=0,
      weight_decay=0.01,
      grad_clip_norm=0.0,
      checkpoint_every=1,
      log_every=1,
      total_steps=6,
  )
  # The same settings again are refused (docs/reliability.md); changed ones go on from step 1.
  with pytest.raises(trainer.NonFiniteLossError, match='step 1 is the newest sound one'):
    training_run.TrainingRun(run_builder.build_parts(config), workdir)
  run = training_run.TrainingRun(run_builder.build_parts(sane), workdir)
  kept_step = int(run.state.step)
  params = jax.tree_util.tree_leaves(jax.device_get(run.state.params))
  run.store.close()
  assert kept_step == 1
  assert all(np.all(np.isfinite(p)) for p in params)
  results = trainer.train_and_evaluate(sane, workdir)
  resumed = {
      m['step']: m['train_loss']
      for m in read_metrics(workdir)
      if 'train_loss' in m and m['step'] > 1
  }
  assert sorted(resumed) == [2, 3, 4, 5, 6]
  assert all(np.isfinite(loss) for loss in resumed.values())
  assert results['step'] == 6 and np.isfinite(results['eval_loss'])


@pytest.mark.slow
def test_a_run_that_diverges_before_any_checkpoint_says_none_was_saved(tmp_path):
  """With no checkpoint yet, the error says so and advises a fresh start."""
  config = tiny_config(
      learning_rate=1e12,
      warmup_steps=0,
      grad_clip_norm=0.0,
      checkpoint_every=100,
      log_every=1,
      total_steps=20,
  )
  with pytest.raises(trainer.NonFiniteLossError, match='No checkpoint was saved'):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert latest_checkpoint(str(tmp_path)) is None


@pytest.mark.parametrize(
    'field', ['learning_rate', 'end_learning_rate', 'weight_decay', 'grad_clip_norm', 'adam_eps']
)
@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_non_finite_optimizer_settings_are_refused_before_anything_runs(field, value):
  """NaN passes every comparison: such a value is refused, naming the field."""
  config = tiny_config(**{field: value})
  with pytest.raises(ConfigError, match=f'config.{field}=.*finite'):
    run_config.RunConfig.from_config(config)


def snapshot(directory):
  digest = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return digest


@pytest.mark.parametrize(
    'overrides,expected',
    [
        (
            ['--config.data.source=text_files', '--config.data.path=/no/such/folder'],
            'config.data.path',
        ),
        (['--config.model.no_such_field=1'], 'no_such_field'),
        (['--config.model.sharing=everything'], 'config.model.sharing'),
        (['--config.model.projected_len=64'], 'config.model.projected_len'),
        (['--config.batch_size=0'], 'config.batch_size'),
        (['--config.data.vocab_size=300'], 'config.model.vocab_size=300'),
        (['--config.learning_rate=nan'], 'config.learning_rate=nan'),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, run_command, overrides, expected):
  result = run_command('train', *tiny_flags(tmp_path / 'run'), *overrides)
  assert result.returncode == 2, result.stderr
  error_lines = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(error_lines) == 1 and expected in error_lines[0], result.stderr
  assert not os.path.exists(tmp_path / 'run') or not snapshot(tmp_path / 'run')


@pytest.mark.slow
def test_empty_corpus_is_an_error(tmp_path, run_command):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'empty.txt').write_text('')
  result = run_command(
      'train',
      *tiny_flags(tmp_path / 'run'),
      '--config.data.source=text_files',
      f'--config.data.path={corpus}',
  )
  assert result.returncode == 2, result.stderr
  assert 'error:' in result.stderr


@pytest.mark.slow
def test_a_workdir_of_another_model_is_refused_untouched(finished_run, run_command):
  workdir, _ = finished_run
  before = snapshot(workdir)
  result = run_command('train', *tiny_flags(workdir), '--config.model.hidden_dim=64')
  assert result.returncode == 2, result.stderr
  assert 'config.model.hidden_dim' in result.stderr
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_evaluate_writes_json_for_a_split(finished_run, run_command):
  workdir, results = finished_run
  result = run_command('evaluate', *tiny_flags(workdir), '--split=validation')
  assert result.returncode == 0, result.stderr
  with open(os.path.join(workdir, 'eval_validation.json')) as f:
    evaluated = json.load(f)
  assert evaluated['step'] == 20
  assert evaluated['eval_loss'] == pytest.approx(results['eval_loss'], rel=1e-5)
