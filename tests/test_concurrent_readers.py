"""Reading a run while it trains (issue 58, item 3).

A run keeps only its newest checkpoints: a reader (evaluate, generate,
spectrum, projection_stats, `linformer_jax.load`, all through
`run_loading.load_run`) may see the step it chose removed before it has read
it. It then chooses the newest kept step again, with one warning; a step
asked for by number is refused in one line naming the steps kept. Here the
run's pruning is played by hand, deterministically, at each point where a
reader can meet it; the last test races a real training run.
"""

import os
import re
import shutil

import pytest
from run_helpers import start_endless_run
from run_helpers import tiny_config
from run_helpers import wait_for_step

import linformer_jax
from linformer_jax import run_folder
from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints import pruned_steps
from linformer_jax.checkpoints import step_files
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_loading


def _prune(workdir, step):
  shutil.rmtree(os.path.join(run_folder.RunFolder(workdir).checkpoints, str(step)))


def _pruning_before(monkeypatch, module, name, workdir, steps):
  """Makes `module.name` remove the newest kept step folder of `workdir` (as
  the run training there would) before it runs, the first `steps` times."""
  original = getattr(module, name)
  pruned = []

  def pruning(*args, **kwargs):
    if len(pruned) < steps:
      newest = max(step_files.step_entries(run_folder.RunFolder(workdir).checkpoints))
      _prune(workdir, newest)
      pruned.append(newest)
    return original(*args, **kwargs)

  monkeypatch.setattr(module, name, pruning)
  return pruned


# Where a reader meets the pruning of the step it chose: while it inspects
# the step, reads its config (orbax: "Checkpoint at ... not found"), or
# reads its arrays.
PRUNED_WHILE = {
    'inspected': (step_files, '_sha256'),
    'its config is read': (CheckpointStore, 'restore_config'),
    'its arrays are read': (partial_restore, '_restore_state'),
}

# How each reader loads a run (as in tests/test_damaged_steps.py).
READERS = {
    'with data (evaluate, spectrum)': lambda w: run_loading.load_run(
        tiny_config(), w, with_data=True
    ),
    'without data (generate, projection_stats)': lambda w: run_loading.load_run(tiny_config(), w),
    'linformer_jax.load': linformer_jax.load,
}


def _pruned_warnings(caplog):
  return [r.getMessage() for r in caplog.records if 'was removed while' in r.getMessage()]


@pytest.mark.parametrize('reader', list(READERS))
@pytest.mark.parametrize('where', list(PRUNED_WHILE))
def test_a_reader_whose_step_is_pruned_reads_the_newest_kept_one(
    run_copy, monkeypatch, caplog, where, reader
):
  module, name = PRUNED_WHILE[where]
  assert _pruning_before(monkeypatch, module, name, run_copy, steps=1) == []
  loaded = READERS[reader](run_copy)
  assert loaded.step == 10
  (warning,) = _pruned_warnings(caplog)
  assert re.fullmatch(
      r'The checkpoint of step 20 in \S+/checkpoints was removed while it was being read \(the '
      r'run writing there keeps only its newest checkpoints\); the steps kept now are 10; '
      'reading the newest of them instead.',
      warning,
  ), warning
  assert not [r for r in caplog.records if 'damaged' in r.getMessage()]


@pytest.mark.parametrize(
    'ask, prefix',
    [
        (
            lambda w: run_loading.load_run(tiny_config(restore_step=20), w),
            'config.restore_step=20: the',
        ),
        (lambda w: linformer_jax.load(w, step=20), 'The'),
    ],
    ids=['config.restore_step', 'load(step=20)'],
)
def test_a_step_asked_for_and_pruned_while_read_is_refused_naming_the_kept_ones(
    run_copy, monkeypatch, ask, prefix
):
  _pruning_before(monkeypatch, partial_restore, '_restore_state', run_copy, steps=1)
  with pytest.raises(ConfigError) as refused:
    ask(run_copy)
  assert re.fullmatch(
      f'{re.escape(prefix)} checkpoint of step 20 in \\S+ was removed while it was being read '
      r'\(the run writing there keeps only its newest checkpoints\); the steps kept now are 10; '
      'ask for one of them.',
      str(refused.value),
  ), refused.value


def test_a_step_asked_for_and_pruned_before_is_refused_naming_the_kept_ones(run_copy):
  _prune(run_copy, 10)
  with pytest.raises(ConfigError, match=r'keeps no checkpoint of step 10; its kept steps are 20'):
    linformer_jax.load(run_copy, step=10)


def test_a_reader_gives_up_in_one_line_when_every_step_it_chooses_is_pruned(
    run_copy, monkeypatch, caplog
):
  directory = run_folder.RunFolder(run_copy).checkpoints
  shutil.copytree(os.path.join(directory, '20'), os.path.join(directory, '30'))
  monkeypatch.setattr(pruned_steps, 'PRUNED_ATTEMPTS', 2)
  _pruning_before(monkeypatch, partial_restore, '_restore_state', run_copy, steps=2)
  with pytest.raises(ConfigError) as refused:
    run_loading.load_run(tiny_config(), run_copy)
  assert str(refused.value).endswith(
      'the steps kept now are 10. The newest step was removed before it was read 2 times in a '
      'row: the run saves faster than this reads. Wait for it to finish, or copy its folder and '
      'read the copy.'
  ), refused.value
  assert len(_pruned_warnings(caplog)) == 1


def test_a_step_being_removed_is_not_called_damaged(run_copy, monkeypatch, caplog):
  """Orbax deletes a pruned step's files before its folder: a reader whose
  inspection meets the folder half gone waits for it to go."""
  folder = os.path.join(run_folder.RunFolder(run_copy).checkpoints, '20')
  original = step_files.inspect
  sleep = pruned_steps.time.sleep
  removed = []

  def half_removed(path, step, items):
    if step == 20 and not removed:
      removed.append(os.path.join(folder, 'config', 'metadata'))
      os.remove(removed[0])
    return original(path, step, items)

  def removing(seconds):  # the rest of the folder goes while the reader looks again
    shutil.rmtree(folder, ignore_errors=True)
    sleep(seconds)

  monkeypatch.setattr(step_files, 'inspect', half_removed)
  monkeypatch.setattr(pruned_steps.time, 'sleep', removing)
  assert run_loading.load_run(tiny_config(), run_copy).step == 10
  assert removed and len(_pruned_warnings(caplog)) == 1
  assert not [r for r in caplog.records if 'damaged' in r.getMessage()]


def test_a_listing_that_meets_a_vanishing_step_lists_again():
  calls = []

  def listing():
    calls.append(1)
    if len(calls) < pruned_steps.PRUNED_ATTEMPTS:
      raise FileNotFoundError(2, 'No such file or directory', '/run/checkpoints/43')
    return 'listed'

  def vanishing():
    raise FileNotFoundError(2, 'No such file or directory', '/run/checkpoints/43')

  assert pruned_steps.listed(listing, '/run/checkpoints') == 'listed'
  with pytest.raises(ConfigError, match=r'/run/checkpoints/43 was removed while it was listed'):
    pruned_steps.listed(vanishing, '/run/checkpoints')


@pytest.mark.slow
@pytest.mark.long
def test_evaluate_while_the_run_trains_and_prunes_never_fails(tmp_path, run_command):
  """A run that saves (and prunes) at every step, read by evaluate three
  times: each reads a kept step, in at most one warning line per retry."""
  workdir = tmp_path / 'run'
  training = start_endless_run(run_command, workdir, checkpoint_every=1)
  try:
    wait_for_step(workdir, 3, training)
    for _ in range(3):
      result = run_command('evaluate', f'--workdir={workdir}', timeout=180)
      assert result.returncode == 0, result.stderr
      assert '"step": ' in result.stdout
      for line in result.stderr.splitlines():
        assert 'was removed while it was being read' in line, result.stderr
  finally:
    training.terminate()
    training.wait(timeout=120)
