"""A damaged newest step, as every reader of a run meets it (issue 61).

The readers (evaluate, generate, spectrum, projection_stats and
`linformer_jax.load`) all load a run through `run_loading.load_run`, and
training resumes through the store that owns the workdir. A damaged newest
step is skipped with one warning naming the step, its first bad file and
what is wrong; asked for by number it is refused in a message that says the
same and which step to use instead, never that the step is not kept.
"""

import glob
import os
import re
import shutil

import pytest
from run_helpers import folder_contents
from run_helpers import one_error_line
from run_helpers import tiny_config
from run_helpers import tiny_flags

import linformer_jax
from linformer_jax import run_folder
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_loading

# What a truncated array file of step 20 reads as, in warnings and errors.
TRUNCATED = (
    r'checkpoint of step 20 in \S+/checkpoints is damaged '
    r'\(state/\S+ holds \d+ bytes, \d+ were written\)'
)


def _truncate_largest_state_file(step_folder):
  files = glob.glob(os.path.join(step_folder, 'state', '**', 'd', '*'), recursive=True)
  path = max(files, key=os.path.getsize)
  os.truncate(path, os.path.getsize(path) // 2)


@pytest.fixture
def damaged_run(tiny_run, tmp_path):
  """A copy of the tiny run (steps 10 and 20) whose step 20 lost the second
  half of its largest array file."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run[0], workdir)
  _truncate_largest_state_file(os.path.join(run_folder.RunFolder(workdir).checkpoints, '20'))
  return workdir


def _damage_warnings(caplog):
  return [r.getMessage() for r in caplog.records if 'damaged' in r.getMessage()]


# How each reader loads a run: evaluate and spectrum with their data,
# generate and projection_stats without, and the Python API.
READERS = {
    'with data (evaluate, spectrum)': lambda w: run_loading.load_run(
        tiny_config(), w, with_data=True
    ),
    'without data (generate, projection_stats)': lambda w: run_loading.load_run(tiny_config(), w),
    'linformer_jax.load': linformer_jax.load,
}


@pytest.mark.parametrize('reader', list(READERS))
def test_every_reader_skips_a_damaged_newest_step_with_one_warning(damaged_run, reader, caplog):
  before = folder_contents(damaged_run)
  assert READERS[reader](damaged_run).step == 10
  (warning,) = _damage_warnings(caplog)
  assert re.fullmatch(
      f'The {TRUNCATED}; skipped it: step 10, the newest intact one, is read instead.', warning
  ), warning
  assert folder_contents(damaged_run) == before


@pytest.mark.parametrize(
    'ask, prefix',
    [
        (
            lambda w: run_loading.load_run(tiny_config(restore_step=20), w),
            'config.restore_step=20: the ',
        ),
        (lambda w: run_loading.load_run(tiny_config(), w, 20), 'The '),
        (lambda w: linformer_jax.load(w, step=20), 'The '),
    ],
    ids=['config.restore_step', 'a reader step', 'load(step=20)'],
)
def test_a_damaged_step_asked_for_is_refused_saying_what_is_wrong(damaged_run, ask, prefix):
  before = folder_contents(damaged_run)
  with pytest.raises(ConfigError) as refused:
    ask(damaged_run)
  message = str(refused.value)
  assert message.startswith(prefix) and 'keeps no checkpoint' not in message, message
  folder = os.path.join(run_folder.RunFolder(damaged_run).checkpoints, '20')
  assert re.fullmatch(
      f'{re.escape(prefix)}{TRUNCATED}; use step 10, the newest intact one, instead, '
      f'or delete {re.escape(folder)} so that step 10 is the newest.',
      message,
  ), message
  assert folder_contents(damaged_run) == before


def test_a_run_with_no_intact_step_says_so(damaged_run, caplog):
  _truncate_largest_state_file(os.path.join(run_folder.RunFolder(damaged_run).checkpoints, '10'))
  with pytest.raises(ConfigError, match=r'Every checkpoint in \S+ is damaged; see the warnings'):
    run_loading.load_run(tiny_config(), damaged_run)
  warnings = _damage_warnings(caplog)
  assert len(warnings) == 2 and all('no older step is intact' in w for w in warnings), warnings


def test_training_moves_the_step_aside_and_then_names_it_when_asked_for(damaged_run, caplog):
  """Training resumes through the store that owns the workdir: it moves the
  damaged step aside with one warning, and the step asked for by number is
  then refused as damaged, where it went, not as a step never kept."""
  directory = run_folder.RunFolder(damaged_run).checkpoints
  with CheckpointStore(directory, owner=True) as store:
    assert store.latest_step() == 10
    moved = os.path.join(run_folder.RunFolder(damaged_run).damaged_checkpoints, '20')
    (warning,) = _damage_warnings(caplog)
    assert 'step 20' in warning and f'moved it to {moved}' in warning
    with pytest.raises(ConfigError) as refused:
      store.refuse_damaged(20, asked_as='config.restore_step=20: ')
    store.refuse_damaged(10)  # intact: nothing to say
    store.refuse_damaged(30)  # never kept: the caller's words
  assert re.fullmatch(
      f'config.restore_step=20: the {TRUNCATED}; the run on this folder moved it to '
      f'{re.escape(moved)}; use step 10, the newest intact one, instead.',
      str(refused.value),
  ), refused.value


@pytest.mark.slow
def test_evaluate_warns_in_one_line_and_refuses_the_damaged_step(damaged_run, run_command):
  result = run_command('evaluate', f'--workdir={damaged_run}')
  assert result.returncode == 0, result.stderr
  assert '"step": 10,' in result.stdout
  (line,) = [line for line in result.stderr.splitlines() if line.strip()]
  assert re.search(f'The {TRUNCATED}; skipped it: step 10, the newest intact one', line), line
  asked = run_command('evaluate', *tiny_flags(damaged_run), '--config.restore_step=20')
  line = one_error_line(asked, 'config.restore_step=20: the checkpoint of step 20', 'is damaged')
  assert 'use step 10, the newest intact one, instead' in line
