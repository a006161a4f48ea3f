"""Nothing silently wrong: a run whose loss stays finite but diverged ends on
steps that are not sound; it says so, exits 2 and saves no results, and a
re-run of its workdir says so too; its advice leads to a sound run; a
perplexity too large to mean anything reads as such, and the files stay
strict JSON (docs/reliability.md, "Ending on unsound steps")."""

import json
import math
import os
import re
import shlex
import shutil

import ml_collections
import pytest
from run_helpers import file_hashes
from run_helpers import tiny_flags

from linformer_jax import run_folder
from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import evaluation
from linformer_jax.training import run_builder
from linformer_jax.training import trainer
from linformer_jax.training import training_run
from linformer_jax.training.metric_writers import MetricLogger
from linformer_jax.training.metric_writers import json_text
from linformer_jax.training.metric_writers import read_metrics
from linformer_jax.training.sound_steps import SoundStepLedger

# configs/tiny.py at a learning rate 50,000 times its own: the loss goes from
# 5.6 to tens of thousands at step 3 and stays there, finite, so no step is
# skipped and the run reaches total_steps.
SETTINGS = {
    'learning_rate': 100.0,
    'checkpoint_every': 5,
    'log_every': 5,
    'eval_every': 5,
    'total_steps': 10,
}


def _strict_json(text):
  """`text` parsed as JSON that has no NaN or Infinity token."""

  def refuse(token):
    raise AssertionError(f'{token} is not JSON')

  return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope='module')
def finite_divergence(tmp_path_factory, run_command):
  """(workdir, its flags, the finished `train` process) of the run above."""
  workdir = tmp_path_factory.mktemp('finite') / 'run'
  flags = [*tiny_flags(workdir), *(f'--config.{key}={value}' for key, value in SETTINGS.items())]
  return workdir, flags, run_command('train', *flags)


def _error_line(process):
  assert process.returncode == 2, process.stdout + process.stderr
  assert 'Traceback' not in process.stdout + process.stderr, process.stderr
  errors = [line for line in process.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1, process.stderr
  return errors[0]


@pytest.mark.slow
def test_a_finite_divergence_says_so_exits_2_and_saves_no_results(finite_divergence):
  workdir, _, process = finite_divergence
  line = _error_line(process)
  assert 'Training diverged: step 10, the last, is not sound (saved while the loss' in line, line
  assert 'before the loss spiked at step 3. No results were saved.' in line, line
  assert 'Kept checkpoints' in line and 'none is from before the divergence' in line, line
  assert not os.path.exists(run_folder.RunFolder(str(workdir)).results)
  assert SoundStepLedger(str(workdir)).diverged['step'] == 3
  # The perplexity of a loss in the tens of thousands: inf, said why, not 305 digits.
  evaluated = [line for line in process.stdout.splitlines() if line.startswith('step 10: ')]
  assert evaluated and 'perplexity inf' in evaluated[0], process.stdout
  assert 'means nothing: the loss diverged' in evaluated[0]
  assert not re.search(r'\d{20}', process.stdout), process.stdout
  with open(workdir / 'metrics.jsonl') as f:
    records = [_strict_json(line) for line in f]
  assert [r['eval_perplexity'] for r in records if 'eval_perplexity' in r] == [None, None]


@pytest.mark.slow
def test_its_advice_trains_a_sound_run(finite_divergence, run_command):
  """The override caused it: the command goes back to the config file's own
  learning rate, in a new workdir (no kept step is sound)."""
  workdir, _, process = finite_divergence
  line = _error_line(process)
  assert "Go on with configs/tiny.py's own learning rate, 0.002 (the override 100" in line, line
  command = shlex.split(line.split(': python -m linformer_jax.train ', 1)[1])
  assert f'--workdir={workdir}-restart' in command
  assert not any(flag.startswith('--config.learning_rate') for flag in command), command
  went_on = run_command('train', *command)
  assert went_on.returncode == 0, went_on.stderr
  with open(run_folder.RunFolder(f'{workdir}-restart').results) as f:
    results = _strict_json(f.read())
  assert results['step'] == 10 and results['eval_loss'] < math.log(260)  # below a uniform guess
  ledger = SoundStepLedger(f'{workdir}-restart')
  assert ledger.steps and all(ledger.is_sound(step) for step in ledger.steps)


@pytest.mark.slow
def test_a_re_run_of_its_workdir_says_why_it_cannot_go_on(finite_divergence, tmp_path):
  """The same settings are refused and changed ones told that no step is
  sound, nothing changed. A workdir from before the check (no divergence
  on record), run again, is evaluated, found diverged and recorded with the
  step's own config: never scored as a finished run."""
  workdir = tmp_path / 'run'
  shutil.copytree(finite_divergence[0], workdir)
  before = file_hashes(workdir)
  same = run_builder.saved_config(str(workdir))  # the command's own config
  lower = ml_collections.ConfigDict(same.to_dict())
  lower.learning_rate = 1e-3
  with pytest.raises(divergence.NonFiniteLossError, match='Refused.*none is sound') as error:
    training_run.TrainingRun(run_builder.build_parts(same), str(workdir))
  assert error.value.restart_workdir == f'{workdir}-restart'
  with pytest.raises(ConfigError, match=r'diverged at step 3 and none of its kept steps \(5, 10\)'):
    training_run.TrainingRun(run_builder.build_parts(lower), str(workdir))
  assert file_hashes(workdir) == before
  ledger = SoundStepLedger(str(workdir))
  ledger.diverged = None
  ledger.write()
  with pytest.raises(divergence.DivergenceError, match='Training diverged: step 10, the last'):
    trainer.train_and_evaluate(lower, str(workdir))
  assert not os.path.exists(run_folder.RunFolder(str(workdir)).results)
  assert SoundStepLedger(str(workdir)).diverged['config']['learning_rate'] == 100
  with pytest.raises(ConfigError, match='diverged, ending at step 10 and none of its kept steps'):
    training_run.TrainingRun(run_builder.build_parts(lower), str(workdir))


def test_a_perplexity_too_large_to_mean_anything_reads_inf_with_a_note():
  assert evaluation.bounded({'loss': 70.0, 'perplexity': math.exp(70.0)})['perplexity'] == math.inf
  kept = {'loss': 5.0, 'perplexity': math.exp(5.0)}
  assert evaluation.bounded(kept) == kept and evaluation.bounded({'loss': 1.0}) == {'loss': 1.0}
  assert evaluation.perplexity_note(math.inf) == (
      ' (a perplexity above 1e30 means nothing: the loss diverged)'
  )
  assert evaluation.perplexity_note(148.4) == '' and evaluation.perplexity_note(None) == ''
  assert json_text({'a': [math.nan, (math.inf, 1.5)]}) == '{"a": [null, [null, 1.5]]}'


def test_metrics_and_results_files_stay_strict_json(tmp_path):
  """A NaN loss (a skipped step's) and an inf perplexity are written null in
  metrics.jsonl and the results files, and read back from metrics.jsonl as NaN."""
  logger = MetricLogger(str(tmp_path), total_steps=2)
  logger.write_scalars(1, {'train_loss': math.nan, 'eval_perplexity': math.inf, 'x': 2.0})
  logger.close()
  with open(tmp_path / 'metrics.jsonl') as f:
    assert _strict_json(f.read()) == {
        'step': 1,
        'train_loss': None,
        'eval_perplexity': None,
        'x': 2.0,
    }
  (record,) = read_metrics(str(tmp_path))
  assert math.isnan(record['train_loss']) and math.isnan(record['eval_perplexity'])
  for write in (trainer._write_json, evaluation.write_results):  # pylint: disable=protected-access
    path = str(tmp_path / 'results.json')
    write(path, {'eval_perplexity': math.inf, 'eval_loss': 60530.0})
    with open(path) as f:
      assert _strict_json(f.read()) == {'eval_perplexity': None, 'eval_loss': 60530.0}


def test_every_reader_of_a_diverged_loss_gets_inf_not_a_clamped_number():
  """The language-modelling metrics every command reads (train, evaluate, load)."""
  from linformer_jax.training import tasks

  task = tasks.MaskedLanguageModelling()
  sums = {'weight_sum': 10.0, 'correct_sum': 0.0}
  assert math.isinf(task.metrics({**sums, 'loss_sum': 10.0 * 700.0})['perplexity'])
  assert task.metrics({**sums, 'loss_sum': 10.0 * 5.0})['perplexity'] == pytest.approx(math.exp(5))
  assert json.loads(json_text(task.metrics({**sums, 'loss_sum': 1e4})))['perplexity'] is None


def test_a_setting_another_extension_adds_at_its_default_changes_no_training_setting():
  """A process that imported more extensions (a notebook, the test suite) adds
  their declared settings to every config it builds: not a change of settings."""
  from linformer_jax.extensions import import_extensions
  from linformer_jax.training.sound_steps import same_training_settings

  import_extensions(['docs/examples/tempered_attention.py'])
  saved = {'model': {'attention': 'linformer'}, 'learning_rate': 1.0}
  built = {'model': {'attention': 'linformer', 'temperature_init': 1.0}, 'learning_rate': 1.0}
  assert same_training_settings(saved, built) and same_training_settings(built, saved)
  changed = {**built, 'model': {**built['model'], 'temperature_init': 2.0}}
  assert not same_training_settings(saved, changed)
