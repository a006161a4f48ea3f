"""config.compilation_cache_dir: where it points JAX's persistent compilation
cache, that a compiled program lands there, and a bad folder as one line."""

import os

import jax
import ml_collections
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.training import compilation_cache
from linformer_jax.training import run_config

CACHE_SETTINGS = ('jax_compilation_cache_dir', *compilation_cache.THRESHOLDS)


@pytest.fixture
def session_cache_settings():
  """Puts back the test session's cache settings (tests/conftest.py) after a test."""
  saved = {name: getattr(jax.config, name) for name in CACHE_SETTINGS}
  yield saved
  for name, value in saved.items():
    jax.config.update(name, value)


def _config(folder):
  return ml_collections.ConfigDict({'compilation_cache_dir': folder})


def test_a_relative_folder_is_inside_the_workdir_and_others_are_kept(tmp_path):
  workdir = str(tmp_path / 'run')
  assert compilation_cache.cache_folder('xla', workdir) == os.path.join(workdir, 'xla')
  assert compilation_cache.cache_folder('/shared/xla', workdir) == '/shared/xla'
  assert compilation_cache.cache_folder('gs://b/xla', workdir) == 'gs://b/xla'
  assert compilation_cache.cache_folder('xla', 'gs://b/run/') == 'gs://b/run/xla'


def test_the_field_sets_jaxs_cache_folder(tmp_path, monkeypatch, session_cache_settings):
  for name in compilation_cache.THRESHOLDS:
    monkeypatch.delenv(name.upper(), raising=False)
  folder = compilation_cache.use_config_cache(_config('xla'), str(tmp_path))
  assert folder == str(tmp_path / 'xla') and os.path.isdir(folder)
  assert jax.config.jax_compilation_cache_dir == folder
  for name, value in compilation_cache.THRESHOLDS.items():
    assert getattr(jax.config, name) == value


def test_an_empty_field_leaves_jaxs_settings_alone(tmp_path, session_cache_settings):
  assert compilation_cache.use_config_cache(_config(''), str(tmp_path)) is None
  # A config saved before the field existed.
  saved = run_config.complete(ml_collections.ConfigDict())
  assert compilation_cache.use_config_cache(saved, str(tmp_path)) is None
  for name, value in session_cache_settings.items():
    assert getattr(jax.config, name) == value


def test_a_file_is_refused(tmp_path, session_cache_settings):
  (tmp_path / 'taken').write_text('')
  with pytest.raises(ConfigError, match=r'compilation_cache_dir: .*taken is a file, not a folder'):
    compilation_cache.use_config_cache(_config(str(tmp_path / 'taken')), '')
  assert jax.config.jax_compilation_cache_dir == session_cache_settings['jax_compilation_cache_dir']


def test_a_compiled_program_lands_in_the_folder(tmp_path, run_python):
  """In a fresh process whose environment names the session's cache (as
  conftest sets it), the field wins."""
  script = tmp_path / 'compile.py'
  script.write_text(
      'import sys\n'
      'import jax\n'
      'import ml_collections\n'
      'from linformer_jax.training import compilation_cache\n'
      "config = ml_collections.ConfigDict({'compilation_cache_dir': 'xla'})\n"
      'compilation_cache.use_config_cache(config, sys.argv[1])\n'
      'jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(4.0)).block_until_ready()\n'
  )
  result = run_python(script, tmp_path / 'run', timeout=120)
  assert result.returncode == 0, result.stderr
  assert any(name.startswith('jit_') for name in os.listdir(tmp_path / 'run' / 'xla'))


def test_a_command_refuses_a_file_in_one_line(tmp_path, run_command):
  (tmp_path / 'taken').write_text('')
  result = run_command(
      'train',
      '--config=configs/tiny.py',
      f'--workdir={tmp_path / "run"}',
      f'--config.compilation_cache_dir={tmp_path / "taken"}',
      timeout=120,
  )
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: config.compilation_cache_dir: {tmp_path / 'taken'} is a file, not a folder; "
      "name a writable folder, or --config.compilation_cache_dir='' for no cache."
  ]
  assert not (tmp_path / 'run').exists()
