"""The real training loop on tiny settings: results, exact resume, signals, errors."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import tiny
from linformer_jax.training import trainer
from linformer_jax.training.checkpoints import CheckpointStore
from linformer_jax.training.metric_writers import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**overrides):
  config = tiny.get_config()
  config.data.cache_dir = os.environ.get('LINFORMER_TEST_CACHE', '')
  for key, value in overrides.items():
    target = config
    *parents, field = key.split('.')
    for parent in parents:
      target = target[parent]
    target[field] = value
  return config


def final_params(workdir, config):
  run = trainer.Run(config, workdir)
  params = jax.tree_util.tree_map(np.asarray, run.state.params)
  run.store.close()
  return int(run.state.step), params


def losses_by_step(workdir):
  return {m['step']: m['train_loss'] for m in read_metrics(workdir) if 'train_loss' in m}


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run'))
  results = trainer.train_and_evaluate(tiny_config(), workdir)
  return workdir, results


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
  assert CheckpointStore(trainer.checkpoint_directory(workdir)).latest_step() == 20
  # The loss went down from its start at about log(vocab).
  first, last = metrics[0]['train_loss'], results['eval_loss']
  assert last < first


def test_resume_is_exact(tmp_path):
  config = tiny_config(total_steps=12, log_every=1, eval_every=6,
                       checkpoint_every=100)
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  trainer.train_and_evaluate(config, straight)
  assert trainer.train_and_evaluate(config, resumed, stop_after=6) is None
  assert CheckpointStore(trainer.checkpoint_directory(resumed)).latest_step() == 6
  trainer.train_and_evaluate(config, resumed)
  assert losses_by_step(straight) == losses_by_step(resumed)
  assert sorted(losses_by_step(resumed)) == list(range(1, 13))
  step_a, params_a = final_params(straight, config)
  step_b, params_b = final_params(resumed, config)
  assert step_a == step_b == 12
  jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)


def run_cli(module, workdir, *overrides, wait=True):
  command = [sys.executable, '-m', f'linformer_jax.{module}',
             '--config', os.path.join(REPO, 'configs', 'tiny.py'),
             '--workdir', workdir, *overrides]
  env = {**os.environ, 'PYTHONPATH': REPO, 'JAX_PLATFORMS': 'cpu'}
  if wait:
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def wait_for_step(workdir, step, process, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert process.poll() is None, process.stdout.read()
    if os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
      if any(m['step'] >= step for m in read_metrics(workdir)):
        return
    time.sleep(0.2)
  raise AssertionError(f'the run never reached step {step}')


def test_sigterm_saves_a_checkpoint_before_exiting(tmp_path):
  workdir = str(tmp_path)
  process = run_cli('train', workdir, '--config.total_steps=100000',
                    '--config.log_every=1', '--config.checkpoint_every=100000',
                    '--config.eval_every=100000', wait=False)
  wait_for_step(workdir, 3, process)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=120) == 128 + signal.SIGTERM
  saved = CheckpointStore(trainer.checkpoint_directory(workdir)).latest_step()
  assert saved is not None and saved >= 3
  assert saved == max(m['step'] for m in read_metrics(workdir))


def latest_checkpoint(workdir):
  store = CheckpointStore(trainer.checkpoint_directory(workdir))
  try:
    return store.latest_step()
  finally:
    store.close()


def test_sigkill_resumes_from_the_last_checkpoint(tmp_path):
  workdir = str(tmp_path)
  config = tiny_config(total_steps=100000, log_every=1, checkpoint_every=4,
                       eval_every=100000)
  process = run_cli('train', workdir, '--config.total_steps=100000',
                    '--config.log_every=1', '--config.checkpoint_every=4',
                    '--config.eval_every=100000', wait=False)
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


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  workdir = str(tmp_path)
  config = tiny_config(learning_rate=1e12, warmup_steps=0, grad_clip_norm=0.0,
                       checkpoint_every=1, total_steps=50)
  with pytest.raises(trainer.NonFiniteLossError, match='learning_rate'):
    trainer.train_and_evaluate(config, workdir)
  store = CheckpointStore(trainer.checkpoint_directory(workdir))
  saved = store.latest_step()
  store.close()
  failed_at = max(m['step'] for m in read_metrics(workdir)) + 1 if read_metrics(workdir) else None
  assert saved is not None and saved >= 1
  assert failed_at is None or saved < failed_at


def snapshot(directory):
  digest = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return digest


@pytest.mark.parametrize('overrides,expected', [
    (['--config.data.source=text_files', '--config.data.path=/no/such/folder'],
     'config.data.path'),
    (['--config.model.no_such_field=1'], 'no_such_field'),
    (['--config.model.sharing=everything'], 'config.model.sharing'),
    (['--config.model.projected_len=64'], 'config.model.projected_len'),
    (['--config.batch_size=0'], 'config.batch_size'),
    (['--config.data.vocab_size=300'], 'config.model.vocab_size=300'),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, overrides, expected):
  result = run_cli('train', str(tmp_path / 'run'), *overrides)
  assert result.returncode == 2, result.stderr
  error_lines = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(error_lines) == 1 and expected in error_lines[0], result.stderr
  assert not os.path.exists(tmp_path / 'run') or not snapshot(tmp_path / 'run')


def test_empty_corpus_is_an_error(tmp_path):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'empty.txt').write_text('')
  result = run_cli('train', str(tmp_path / 'run'), '--config.data.source=text_files',
                   f'--config.data.path={corpus}')
  assert result.returncode == 2, result.stderr
  assert 'error:' in result.stderr


def test_a_workdir_of_another_model_is_refused_untouched(finished_run):
  workdir, _ = finished_run
  before = snapshot(workdir)
  result = run_cli('train', workdir, '--config.model.hidden_dim=64')
  assert result.returncode == 2, result.stderr
  assert 'config.model.hidden_dim' in result.stderr
  assert snapshot(workdir) == before


def test_evaluate_writes_json_for_a_split(finished_run):
  workdir, results = finished_run
  result = run_cli('evaluate', workdir, '--split=validation')
  assert result.returncode == 0, result.stderr
  with open(os.path.join(workdir, 'eval_validation.json')) as f:
    evaluated = json.load(f)
  assert evaluated['step'] == 20
  assert evaluated['loss'] == pytest.approx(results['eval_loss'], rel=1e-5)
