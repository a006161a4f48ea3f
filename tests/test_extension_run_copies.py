"""A run carries its extension files: its config.json names them by absolute
path and WORKDIR/extensions/ keeps a copy of each, so that the run loads from
any directory, and from its copy once the original moves or changes; one line
says which file was used. Unit checks on a run folder written by hand, and one
tiny run trained with a relative path, loaded and evaluated from elsewhere."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from run_helpers import REPO_ROOT

import linformer_jax
from linformer_jax import extensions
from linformer_jax.errors import ConfigError
from linformer_jax.model import projections

# A projection kind that pools as 'mean' does; {name} registers it, {note} is
# a comment that makes another version of the file.
KIND_FILE = """
from linformer_jax.model import projections
from linformer_jax.model.projections.mean import MeanPooling

# {note}


@projections.REGISTRY.register('{name}')
class Pooled(MeanPooling):
  pass
"""


def write_kind(path, name, note='first version'):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(KIND_FILE.format(name=name, note=note)))
  return path


def test_a_run_names_its_files_by_absolute_path_and_keeps_a_copy_of_each(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  first = write_kind(tmp_path / 'ext' / 'pooled.py', 'unused_a')
  second = write_kind(tmp_path / 'other' / 'pooled.py', 'unused_b', note='another file')
  entries = ('ext/pooled.py', 'other/pooled.py', 'some_package.kinds', 'ext/pooled.py')
  assert extensions.saved_entries(entries) == (
      str(first),
      str(second),
      'some_package.kinds',
      str(first),
  )
  extensions.keep_copies(entries, str(tmp_path / 'run'))
  kept = tmp_path / 'run' / 'extensions'
  assert sorted(os.listdir(kept)) == ['pooled.py', 'pooled_2.py']  # one per file, names kept apart
  assert (kept / 'pooled.py').read_text() == first.read_text()
  assert (kept / 'pooled_2.py').read_text() == second.read_text()


def file_of(name):
  """The file the projection kind registered as `name` was defined in."""
  return sys.modules[projections.REGISTRY.get(name).__module__].__file__


def run_with_copy(tmp_path, name):
  """A run folder keeping a copy of the file of kind `name`, and its original."""
  original = write_kind(tmp_path / 'ext' / f'{name}.py', name)
  extensions.keep_copies((str(original),), str(tmp_path / 'run'))
  return str(tmp_path / 'run'), original, str(tmp_path / 'run' / 'extensions' / f'{name}.py')


def test_the_original_is_imported_while_it_is_the_runs_copy(tmp_path):
  run, original, _ = run_with_copy(tmp_path, 'kept_and_unchanged')
  used, line = extensions.import_run_extensions((str(original),), run)
  assert used == (str(original),) and 'kept_and_unchanged' in projections.REGISTRY
  assert line == f"Extensions of {run}: {original} (the original, identical to the run's copy)."


def test_the_copy_is_imported_when_the_original_moved(tmp_path):
  run, original, copy = run_with_copy(tmp_path, 'moved_before_import')
  original.rename(tmp_path / 'elsewhere.py')
  used, line = extensions.import_run_extensions((str(original),), run)
  assert used == (copy,)
  assert line == f"Extensions of {run}: {original} moved: the run's copy {copy}."
  assert file_of('moved_before_import') == copy
  extensions.import_extensions((str(original),))  # the copy stands for it: nothing to import


def test_the_copy_is_imported_when_the_original_changed(tmp_path):
  run, original, copy = run_with_copy(tmp_path, 'changed_before_import')
  write_kind(original, 'changed_before_import', note='an edit after training')
  used, line = extensions.import_run_extensions((str(original),), run)
  assert used == (copy,) and file_of('changed_before_import') == copy
  assert line.endswith(f"{original} changed since the run was trained: the run's copy {copy}.")


def test_a_file_imported_before_it_moved_or_changed(tmp_path):
  # Moved after this process imported it as the run has it: the same code.
  run, original, copy = run_with_copy(tmp_path / 'a', 'moved_after_import')
  extensions.import_extensions((str(original),))
  registered = projections.REGISTRY.get('moved_after_import')
  original.unlink()
  assert extensions.import_run_extensions((str(original),), run)[0] == (copy,)
  assert projections.REGISTRY.get('moved_after_import') is registered
  # Changed and imported as it is now: the run's code cannot join it here.
  run, original, copy = run_with_copy(tmp_path / 'b', 'changed_after_import')
  write_kind(original, 'changed_after_import', note='an edit after training')
  extensions.import_extensions((str(original),))
  with pytest.raises(ConfigError) as error:
    extensions.import_run_extensions((str(original),), run)
  assert str(error.value) == (
      f'{original} changed since the run was trained, and this process imported it before as '
      f"it is now; load {run} in a new Python process to use the run's copy {copy}."
  )


def test_a_run_saved_before_runs_kept_copies_imports_its_files_as_named(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  write_kind(tmp_path / 'ext' / 'old_run_kind.py', 'old_run_kind')
  used, line = extensions.import_run_extensions(('ext/old_run_kind.py',), str(tmp_path / 'run'))
  assert used == ('ext/old_run_kind.py',) and line == ''
  assert 'old_run_kind' in projections.REGISTRY


def run_commands(cases, folder, cwd):
  """Each case ([module, *args]) as `python -m linformer_jax.MODULE ARGS` in
  `cwd`, forked from one process (tests/command_runner.py); their results."""
  cases_path, results_path = folder / 'cases.json', folder / 'results.json'
  cases_path.write_text(json.dumps([{'module': m, 'args': a, 'env': {}} for m, *a in cases]))
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT), 'JAX_PLATFORMS': 'cpu'}
  runner = subprocess.run(
      [sys.executable, str(REPO_ROOT / 'tests' / 'command_runner.py'), cases_path, results_path],
      cwd=cwd,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert runner.returncode == 0, runner.stdout + runner.stderr
  return json.loads(results_path.read_text())


@pytest.mark.slow
def test_a_run_trained_with_a_relative_path_loads_from_anywhere_and_after_the_file_moves(
    tmp_path, monkeypatch, capsys
):
  project, elsewhere, run = tmp_path / 'project', tmp_path / 'elsewhere', tmp_path / 'run'
  elsewhere.mkdir()
  original = write_kind(project / 'ext' / 'run_copy_pooling.py', 'run_copy_pooling')
  short = ['total_steps=2', 'warmup_steps=1', 'eval_every=2', 'checkpoint_every=2']
  (trained,) = run_commands(
      [
          [
              'train',
              f'--config={REPO_ROOT / "configs" / "tiny.py"}',
              f'--workdir={run}',
              "--config.extensions=('ext/run_copy_pooling.py',)",
              '--config.model.projection=run_copy_pooling',
              '--config.data.max_eval_batches=1',
              *[f'--config.{setting}' for setting in short],
          ]
      ],
      tmp_path,
      cwd=project,
  )
  assert trained['returncode'] == 0, trained['stdout'][-2000:] + trained['stderr']
  assert json.loads((run / 'config.json').read_text())['extensions'] == [str(original)]
  copy = run / 'extensions' / 'run_copy_pooling.py'
  assert copy.read_text() == original.read_text()

  monkeypatch.chdir(elsewhere)
  capsys.readouterr()
  loaded = linformer_jax.load(str(run))
  assert loaded.step == 2 and loaded.config.model.projection == 'run_copy_pooling'
  printed = capsys.readouterr().out
  assert f"Extensions of {run}: {original} (the original, identical to the run's copy)." in printed

  original.parent.rename(project / 'moved')
  again = linformer_jax.load(str(run))
  assert again.config.extensions == (str(copy),)
  assert f"Extensions of {run}: {original} moved: the run's copy {copy}." in capsys.readouterr().out

  # A fresh process, which never saw the original, imports the copy.
  (evaluated,) = run_commands([['evaluate', f'--workdir={run}']], tmp_path, cwd=elsewhere)
  assert evaluated['returncode'] == 0, evaluated['stdout'][-2000:] + evaluated['stderr']
  assert f"Extensions of {run}: {original} moved: the run's copy {copy}." in evaluated['stdout']
  results = json.loads(evaluated['stdout'][evaluated['stdout'].index('{') :])
  assert results['step'] == 2
