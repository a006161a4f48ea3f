"""Bad input to a command ends with one `error:` line on stderr and exit code 2,
before anything is written: the workdir is never created.

Every kind of bad input is checked once through the real command (the `slow`
tests, which stop before any training); its variants are checked in-process
on the function that refuses them.
"""

import os
import pathlib
import subprocess

import pytest
from run_helpers import one_error_line

from linformer_jax import cli
from linformer_jax import sweep as sweep_lib
from linformer_jax.data import cache as cache_lib
from linformer_jax.errors import ConfigError


def assert_one_error_line(
    process: subprocess.CompletedProcess, workdir: pathlib.Path, *names: str
) -> str:
  """Checks the contract (`one_error_line`) and that the workdir was not
  created; returns the line, which must name every one of `names`."""
  line = one_error_line(process, *names)
  assert not workdir.exists(), f'{workdir} was created'
  return line


# A config file's text (None: no file) and what the error line must say.
CONFIG_FILES = {
    'missing': (None, 'no such file'),
    'syntax_error': ('def get_config(:\n  pass\n', 'SyntaxError'),
    'unclosed_paren': ('x = f(\n', "SyntaxError: '(' was never closed (line 1)"),
    'raises_on_import': ("raise RuntimeError('boom')\n", 'RuntimeError: boom (line 1)'),
    'import_error': ('import no_such_module_here\n', 'ModuleNotFoundError'),
    'get_config_raises': (
        'def get_config():\n  return {}["model"]\n',
        "KeyError: 'model' (line 2)",
    ),
    'no_get_config': ('x = 1\n', 'defines no get_config()'),
    'returns_an_int': ('def get_config():\n  return 3\n', 'returned int, not an'),
    'returns_none': ('def get_config():\n  pass\n', 'returned None, not an'),
}


def config_file(tmp_path: pathlib.Path, case: str) -> str:
  text, _ = CONFIG_FILES[case]
  path = tmp_path / f'{case}.py'
  if text is not None:
    path.write_text(text)
  return str(path)


@pytest.mark.parametrize('case', sorted(CONFIG_FILES))
def test_a_config_file_that_cannot_be_loaded_is_refused_naming_it(tmp_path, case):
  path = config_file(tmp_path, case)
  with pytest.raises(cli.ConfigFileError) as raised:
    cli.ConfigFileParser('config').parse(path)
  assert f'--config={path}' in str(raised.value)
  assert CONFIG_FILES[case][1] in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    'command, case',
    [
        ('train', 'raises_on_import'),
        ('train', 'missing'),
        ('evaluate', 'syntax_error'),
        ('prepare_data', 'returns_none'),
        ('spectrum', 'missing'),
        ('mesh_memory', 'no_get_config'),
    ],
)
def test_every_command_with_a_config_file_reports_it_in_one_line(
    tmp_path, run_command, command, case
):
  path, workdir = config_file(tmp_path, case), tmp_path / 'run'
  process = run_command(command, f'--config={path}', f'--workdir={workdir}')
  assert_one_error_line(process, workdir, f'--config={path}', CONFIG_FILES[case][1])


@pytest.mark.parametrize(
    'key, value',
    [
        ('learning_rate', 'nan'),
        ('learning_rate', 'inf'),
        ('model.dropout_rate', '-inf'),
        ('weight_decay', '1e999'),
    ],
)
def test_a_sweep_set_of_a_non_finite_float_is_refused_naming_it(key, value):
  base = sweep_lib.load_sweep('configs/sweeps/projected_len.py').base
  with pytest.raises(ConfigError, match=f'--set={key}={value}: .*finite number'):
    sweep_lib.parse_sets(base, [f'{key}={value}'])


@pytest.mark.slow
def test_a_sweep_set_of_nan_is_one_line(tmp_path, run_command):
  workdir = tmp_path / 'sweep'
  process = run_command(
      'sweep',
      '--sweep=configs/sweeps/projected_len.py',
      f'--workdir={workdir}',
      '--set=total_steps=2',
      '--set=learning_rate=nan',
  )
  assert_one_error_line(process, workdir, '--set=learning_rate=nan', 'finite number')


@pytest.mark.parametrize(
    'text, expected',
    [
        ('def get_sweep(:\n', 'SyntaxError'),
        ("raise RuntimeError('boom')\n", 'RuntimeError: boom'),
        ('x = 1\n', 'defines no get_sweep()'),
    ],
)
def test_a_sweep_file_that_cannot_be_loaded_is_refused_naming_it(tmp_path, text, expected):
  path = tmp_path / 'bad_sweep.py'
  path.write_text(text)
  with pytest.raises(ConfigError) as raised:
    sweep_lib.load_sweep(str(path))
  assert str(path) in str(raised.value) and expected in str(raised.value)


@pytest.mark.slow
def test_a_sweep_file_that_cannot_be_loaded_is_one_line(tmp_path, run_command):
  path, workdir = tmp_path / 'bad_sweep.py', tmp_path / 'sweep'
  path.write_text("raise RuntimeError('boom')\n")
  process = run_command('sweep', f'--sweep={path}', f'--workdir={workdir}')
  assert_one_error_line(process, workdir, str(path), 'RuntimeError: boom')


@pytest.mark.parametrize(
    'setting, inside',
    [('config', ''), ('config', 'cache'), ('variable', ''), ('variable', 'cache')],
)
def test_a_cache_folder_that_is_a_file_is_refused_naming_the_setting(
    tmp_path, monkeypatch, setting, inside
):
  """config.data.cache_dir or $LINFORMER_JAX_CACHE_DIR naming a file, or a
  folder inside one."""
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a folder')
  cache = str(blocker / inside) if inside else str(blocker)
  if setting == 'config':
    named = f'config.data.cache_dir={cache!r}'
    call = lambda: cache_lib.cache_root(cache)  # noqa: E731
  else:
    monkeypatch.setenv(cache_lib.CACHE_DIR_VARIABLE, cache)
    named = f'${cache_lib.CACHE_DIR_VARIABLE}={cache!r}'
    call = cache_lib.cache_root
  with pytest.raises(ConfigError) as raised:
    call()
  assert named in str(raised.value) and f'{blocker} is a file' in str(raised.value)
  assert os.path.isfile(blocker)


@pytest.mark.slow
def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path, run_command):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a folder')
  workdir = tmp_path / 'run'
  process = run_command(
      'train',
      '--config=configs/tiny.py',
      f'--workdir={workdir}',
      f'--config.data.cache_dir={blocker}',
  )
  assert_one_error_line(process, workdir, f'config.data.cache_dir={str(blocker)!r}', 'is a file')


def test_a_cache_folder_that_can_be_made_is_accepted_and_not_made(tmp_path):
  cache = tmp_path / 'new' / 'cache'
  assert cache_lib.cache_root(str(cache)) == cache
  assert not (tmp_path / 'new').exists()
