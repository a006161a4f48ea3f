"""Bad input to a command ends with one `error:` line on stderr and exit code 2,
before anything is written: the workdir is never created.

Every kind of bad input is checked once through the real command (the `slow`
tests, which stop before any training); its variants are checked in-process
on the function that refuses them.
"""

import dataclasses
import importlib
import json
import logging
import os
import pathlib
import re
import subprocess
import time
import types

from absl import flags
from command_input_cases import EMULATOR_VARIABLES
import pytest
from run_helpers import free_port
from run_helpers import one_error_line
from run_helpers import tiny_config
import test_layout

import linformer_jax
from linformer_jax import cli
from linformer_jax import extensions
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax import sweep as sweep_lib
from linformer_jax.data import cache as cache_lib
from linformer_jax.data import data_config
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_config


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


# Paths: `~` is the home folder in every path flag and config field; a name
# that is not UTF-8, or a gs:// path that cannot be used, is one line before
# anything reads it. The commands themselves: tests/command_input_cases.py.

NOT_UTF8 = os.fsdecode(b'/tmp/bad\xff')  # as Python decodes such a name from argv


@pytest.fixture
def home(tmp_path, monkeypatch):
  """A home folder of the test's own ($HOME), and no $LINFORMER_JAX_CACHE_DIR."""
  monkeypatch.setenv('HOME', str(tmp_path))
  monkeypatch.delenv(cache_lib.CACHE_DIR_VARIABLE, raising=False)
  return tmp_path


@pytest.fixture
def no_network(monkeypatch):
  """An object store where nothing listens: the clients' NO_NETWORK."""
  for name in EMULATOR_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', f'http://127.0.0.1:{free_port()}')
  return monkeypatch


def config_with(field: str, value: str):
  config = tiny_config()
  *parents, name = field.split('.')
  section = config
  for parent in parents:
    section = section[parent]
  section[name] = value
  return config


def test_a_leading_tilde_is_the_home_folder_in_every_path_field(home):
  config = tiny_config()
  for field in run_config.PATH_FIELDS:
    config_with_field = config
    *parents, name = field.split('.')
    for parent in parents:
      config_with_field = config_with_field[parent]
    config_with_field[name] = f'~/{field}'
  config.extensions = ('~/own.py', 'a.module', 'kept/relative.py')
  paths = dict(run_config.expand_paths(config))
  for field in run_config.PATH_FIELDS:
    assert paths[f'config.{field}'] == f'{home}/{field}'
  assert config.init_from == f'{home}/init_from'
  assert config.data.cache_dir == f'{home}/data.cache_dir'
  assert config.extensions == (f'{home}/own.py', 'a.module', 'kept/relative.py')
  assert [path for setting, path in run_config.expand_paths(config) if 'extensions' in setting] == [
      f'{home}/own.py',
      'kept/relative.py',
  ]


def test_the_cache_variable_is_a_path_of_the_config_when_no_field_names_one(home, monkeypatch):
  monkeypatch.setenv(cache_lib.CACHE_DIR_VARIABLE, 'gs://bucket/cache')
  paths = run_config.expand_paths(tiny_config())
  assert ('$LINFORMER_JAX_CACHE_DIR', 'gs://bucket/cache') in paths
  with pytest.raises(ConfigError, match=r"^\$LINFORMER_JAX_CACHE_DIR='gs://bucket/cache' names"):
    storage.check_paths(paths, run_config.LOCAL_PATHS)
  assert '$LINFORMER_JAX_CACHE_DIR' not in dict(
      run_config.expand_paths(config_with('data.cache_dir', str(home)))
  )


@pytest.mark.parametrize(
    'setting', ['--workdir', '--out', '--config'] + [f'config.{f}' for f in run_config.PATH_FIELDS]
)
def test_a_name_that_is_not_utf8_is_refused_naming_the_setting(setting):
  with pytest.raises(ConfigError) as raised:
    storage.check_paths([('--workdir', '/tmp/fine'), (setting, f'{NOT_UTF8}/run')])
  assert str(raised.value) == (
      f"{setting}='/tmp/bad\\xff/run' is not a valid UTF-8 name, and the libraries a run uses "
      f'take UTF-8 paths only; rename the folder or file, or choose another {setting}.'
  )


@pytest.mark.parametrize('path', ['/tmp/caf\xe9/run', '/tmp/\u30e9\u30f3/run', 'runs/a'])
def test_a_name_in_utf8_passes(path):
  storage.check_paths([('--workdir', path)])


def test_a_lone_surrogate_from_a_config_file_is_refused_too():
  with pytest.raises(ConfigError, match=r"config.data.path='/tmp/\\ud800' is not a valid UTF-8"):
    storage.check_paths([('config.data.path', '/tmp/\ud800')])


@pytest.mark.parametrize('field', run_config.PATH_FIELDS)
def test_a_gs_path_in_any_field_without_network_is_one_line_at_once(no_network, field):
  config = config_with(field, f'gs://bucket/{field}')
  start = time.monotonic()
  with pytest.raises(ConfigError) as raised:
    storage.check_paths(run_config.expand_paths(config), run_config.LOCAL_PATHS, timeout_s=5)
  line = str(raised.value)
  assert line.startswith(f'config.{field}=') and '\n' not in line
  if field == 'data.cache_dir':  # never on gs://: refused without a request
    assert 'names an object store; the data cache is a folder on this machine' in line
  else:
    assert 'cannot be reached (Connection refused)' in line
  assert time.monotonic() - start < 5


def test_the_store_is_checked_once_naming_the_first_setting_on_it(monkeypatch):
  checked = []
  monkeypatch.setattr(storage, 'check_reachable', lambda *args: checked.append(args))
  storage.check_paths(
      [('--workdir', '/tmp/run'), ('config.init_from', 'gs://b/old/'), ('--out', 'gs://b/x')]
  )
  assert checked == [('gs://b/old', 'config.init_from', None)]


@pytest.mark.parametrize(
    'path, words',
    [
        ('gs:///run', 'names no bucket'),
        ('s3://bucket/run', 's3:// is not a supported storage'),
    ],
)
def test_a_url_the_run_cannot_use_is_refused_before_any_request(monkeypatch, path, words):
  monkeypatch.setattr(storage, 'check_reachable', None)  # never called
  with pytest.raises(ConfigError, match=f'^config.init_from={path!r}:? {words}'):
    storage.check_paths([('config.init_from', path)])


def test_a_local_only_setting_refuses_a_url_in_its_own_words(monkeypatch):
  monkeypatch.setattr(storage, 'check_reachable', None)  # never called
  with pytest.raises(ConfigError) as raised:
    storage.check_paths([('--out', 'gs://b/plots')], {'--out': 'give a local --out'})
  assert str(raised.value) == "--out='gs://b/plots' names an object store; give a local --out."


@pytest.mark.parametrize('setting', ['config', 'variable'])
def test_a_gs_cache_is_refused_by_the_cache_itself(monkeypatch, setting):
  """For the Python API, which reads no flags."""
  if setting == 'variable':
    monkeypatch.setenv(cache_lib.CACHE_DIR_VARIABLE, 'gs://bucket/cache')
  cache_dir = 'gs://bucket/cache' if setting == 'config' else ''
  with pytest.raises(ConfigError, match='names an object store; the data cache is a folder'):
    cache_lib.cache_root(cache_dir)


def test_an_extension_file_is_found_under_home_and_one_on_gs_is_refused(home):
  (home / 'tilde_extension.py').write_text('LOADED = True\n')
  extensions.import_extensions(('~/tilde_extension.py',))
  assert extensions.saved_entries(('~/tilde_extension.py',)) == (f'{home}/tilde_extension.py',)
  with pytest.raises(ConfigError, match="names 'gs://b/own.py': an extension is imported from a"):
    extensions.import_extensions(('gs://b/own.py',))


def test_a_config_file_under_home_is_loaded(home):
  (home / 'own_config.py').write_text(
      'from configs import tiny\n\ndef get_config():\n  return tiny.get_config()\n'
  )
  config = cli.ConfigFileParser('config').parse('~/own_config.py')
  assert config.model.max_len == 32
  with pytest.raises(cli.ConfigFileError, match=r"--config='/tmp/bad\\xff/c.py' is not a valid"):
    cli.ConfigFileParser('config').parse(f'{NOT_UTF8}/c.py')


def test_a_sweep_variant_gets_its_paths_expanded_and_checked(home, no_network):
  sweep = sweep_lib.load_sweep('configs/sweeps/projected_len.py')
  configs = sweep_lib.variant_configs(sweep, ['data.cache_dir=~/cache'])
  assert {config.data.cache_dir for config in configs.values()} == {f'{home}/cache'}
  with pytest.raises(ConfigError, match="^sweep variant '.*': config.data.prepared_dir=gs://b/p: "):
    sweep_lib.variant_configs(sweep, ['data.prepared_dir=gs://b/p'])


def command_modules():
  """Every command module (tests/test_layout.py's list).

  Importing linformer_jax.train binds the package's `train` to that module;
  the Python API's `linformer_jax.train` (a lazy attribute) stays the function
  for the tests that run after this one in the same process.
  """
  modules = [importlib.import_module(f'linformer_jax.{name}') for name in test_layout.COMMANDS]
  for name in linformer_jax.__all__:
    if isinstance(vars(linformer_jax).get(name), types.ModuleType):
      delattr(linformer_jax, name)
  return modules


# The run config's sections: their fields are --config.X fields, which
# ml_collections defines from the config file.
CONFIG_SECTIONS = (
    *run_config.TOP_LEVEL_SECTIONS,
    ModelConfig,
    data_config.DataConfig,
    data_config.ClassificationDataConfig,
)


def test_every_path_flag_of_every_command_is_checked():
  """A flag whose help names a file, folder or directory (or a Python to run)
  is in cli.PATH_FLAGS, so that `~`, UTF-8 and gs:// are checked for it."""
  words = re.compile(r'\b(file|files|folder|directory|python that)\b', re.IGNORECASE)
  found = {}
  for module in command_modules():
    values = flags.FlagValues()
    for settings_type in vars(module).values():
      if dataclasses.is_dataclass(settings_type) and isinstance(settings_type, type):
        if settings_type not in CONFIG_SECTIONS:  # --config.X fields, not the command's flags
          settings_flags.define_flags(settings_type, values)
    for name, flag in values._flags().items():  # pylint: disable=protected-access
      if isinstance(flag.default, (str, list, type(None))) and words.search(flag.help or ''):
        found.setdefault(name, module.__name__)
  missing = {name: module for name, module in found.items() if name not in cli.PATH_FLAGS}
  assert not missing, f'path flags not in cli.PATH_FLAGS: {missing}'
  assert set(found) == set(cli.PATH_FLAGS)


def test_credentials_without_a_project_are_found_without_a_second_line(
    tmp_path, monkeypatch, caplog
):
  """google.auth warns that no project is set; the store check prints one line only."""
  key = tmp_path / 'user.json'
  key.write_text(
      json.dumps(
          {'type': 'authorized_user', 'client_id': 'a', 'client_secret': 'b', 'refresh_token': 'c'}
      )
  )
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', str(key))
  for name in ('GOOGLE_CLOUD_PROJECT', 'GCLOUD_PROJECT', 'CLOUDSDK_CORE_PROJECT'):
    monkeypatch.delenv(name, raising=False)
  with caplog.at_level(logging.INFO):
    assert storage._credentials_problem() == ''  # pylint: disable=protected-access
  assert not [record for record in caplog.records if record.name.startswith('google.auth')]
