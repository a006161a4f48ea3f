"""Every command's inputs get the project's contract: bad input ends in one
line on stderr, `error: ...`, with exit code 2, no traceback, and nothing
under the case's folders changed or created (nor a folder named `~` in the
working directory).

CASES (tests/command_input_cases.py) is the table, by command and class of
input: sampling settings, step choices, read-only, missing and file
workdirs, bad flags and unknown config keys, and in every path flag and
path field of the config: `~` (the line names the expanded path), names
that are not valid UTF-8, object stores without credentials or network.
docs/reliability.md ("Every command's inputs") lists it with the line each
case returns.

Each case runs as `python -m linformer_jax.COMMAND ARGS` in its own process,
all of them forked one after another from one process that imported the
libraries once (tests/command_runner.py): a case then costs its own work,
not JAX's import. The read-only cases run inside a private mount namespace
where their folders are bind-mounted read-only (skipped where the kernel
does not allow it). `test_a_fresh_python_prints_the_runners_line` runs two
cases again through a plain `python -m`.

Each case gets its own folder holding what its arguments name (a copy of a
finished run, a file, a read-only folder: see the table's module), and every
file and folder below it is hashed before and after. The fast tests at the
end check the refusals themselves, in-process.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
from typing import Dict

from command_input_cases import CASES
from command_input_cases import CAUSAL_FIELDS
from command_input_cases import EMULATOR_VARIABLES
from command_input_cases import FRESH_CASES
from command_input_cases import IMPORT
from command_input_cases import NO_CREDENTIALS
from command_input_cases import REPO_ROOT
from command_input_cases import Case
import pytest
from run_helpers import can_mount_privately
from run_helpers import folder_contents
from run_helpers import free_port
from run_helpers import one_error_line
from run_helpers import run_forked_commands
from run_helpers import tiny_config
from run_helpers import typed

from linformer_jax import flag_errors
from linformer_jax import storage
from linformer_jax.errors import ConfigError
from linformer_jax.model import generation
from linformer_jax.training import evaluation
from linformer_jax.training import text_generation
from linformer_jax.training import trainer

PRIVATE_MOUNTS = can_mount_privately()


def materialise(case_: Case, folder: pathlib.Path, runs: Dict[str, str], refused_port: int):
  """(args, env, placeholders, read-only folders) of `case_`, its folders made
  under `folder`."""
  folder.mkdir(parents=True)
  text = ' '.join((*case_.args, *(value for _, value in case_.env), case_.says))
  places, read_only = {'refused_port': str(refused_port), 'home': str(folder)}, []
  for name in ('run', 'causal', 'read_only'):
    if '{' + name + '}' in text:
      places[name] = str(folder / name)
      shutil.copytree(runs['causal' if name == 'causal' else 'masked'], places[name])
  if '{file}' in text:
    places['file'] = str(folder / 'a_file')
    pathlib.Path(places['file']).write_text('not a folder')
  if '{missing}' in text:
    places['missing'] = str(folder / 'missing')
  if '{not_utf8' in text:
    places['not_utf8'] = str(folder / os.fsdecode(b'bad\xff'))
    places['not_utf8_shown'] = str(folder / 'bad\\xff')
    os.mkdir(places['not_utf8'])
  if '{read_only_folder}' in text:
    places['read_only_folder'] = str(folder / 'read_only_folder')
    os.mkdir(places['read_only_folder'])
  read_only = [places[name] for name in ('read_only', 'read_only_folder') if name in places]
  args = [arg.format(**places) for arg in case_.args]
  env = {name: value.format(**places) for name, value in case_.env}
  return args, env, places, read_only


def case_environment():
  """The environment of every case: the test session's (its data and
  compilation caches), no emulator, credentials that cannot be found."""
  env = {name: value for name, value in os.environ.items() if name not in EMULATOR_VARIABLES}
  return {**env, **NO_CREDENTIALS, 'PYTHONPATH': str(REPO_ROOT), 'JAX_PLATFORMS': 'cpu'}


@pytest.fixture(scope='module')
def runs(tiny_run, tmp_path_factory):
  """{'masked': the tiny masked-LM run (steps 10 and 20 kept), 'causal': a
  tiny causal-LM run of two steps (steps 1 and 2 kept)}."""
  causal = str(tmp_path_factory.mktemp('causal') / 'run')
  config = tiny_config(
      **CAUSAL_FIELDS, total_steps=2, warmup_steps=1, checkpoint_every=1, eval_every=2, log_every=1
  )
  trainer.train_and_evaluate(config, causal)
  return {'masked': tiny_run[0], 'causal': causal}


@pytest.fixture(scope='module')
def outcomes(runs, tmp_path_factory, request):
  """name -> (completed process, placeholders, contents before, contents
  after) of every case that can run here and that this session tests (all
  of them, or the representatives of `make test`), all run by one
  command_runner."""
  root = tmp_path_factory.mktemp('cases')
  refused_port = free_port()
  tested = {
      item.callspec.params['name']
      for item in request.session.items
      if getattr(item, 'originalname', '')
      == 'test_bad_input_is_one_line_exit_2_and_changes_nothing'
  } | set(FRESH_CASES)
  names = [
      name
      for name in CASES
      if name in tested and (PRIVATE_MOUNTS or not CASES[name].needs_private_mounts())
  ]
  prepared, read_only = {}, []
  for number, name in enumerate(names):
    args, env, places, mounts = materialise(CASES[name], root / str(number), runs, refused_port)
    prepared[name] = (args, env, places, folder_contents(root / str(number)))
    read_only += mounts
  cases = [
      {'module': CASES[name].command, 'args': prepared[name][0], 'env': prepared[name][1]}
      for name in names
  ]
  results = run_forked_commands(cases, root, case_environment(), read_only)
  found = {}
  for number, (name, result) in enumerate(zip(names, results)):
    args, _, places, before = prepared[name]
    process = subprocess.CompletedProcess(
        [CASES[name].command, *args], result['returncode'], result['stdout'], result['stderr']
    )
    found[name] = (process, places, before, folder_contents(root / str(number)))
  return found


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(outcomes, name):
  if name not in outcomes:
    pytest.skip('this kernel does not allow private (read-only) mounts')
  process, places, before, after = outcomes[name]
  one_error_line(process, CASES[name].says.format(**places))
  assert CASES[name].printed in process.stdout, process.stdout
  assert after == before, f'{name} changed its folders'
  assert not (REPO_ROOT / '~').exists(), 'a folder named ~ was made in the working directory'


@pytest.mark.slow
@pytest.mark.parametrize('name', FRESH_CASES)
def test_a_fresh_python_prints_the_runners_line(outcomes, runs, run_command, tmp_path, name):
  """The case through a plain `python -m`: the same line as in the runner."""
  args, env, places, _ = materialise(CASES[name], tmp_path / 'case', runs, free_port())
  before = folder_contents(tmp_path / 'case')
  assert not env, 'a fresh case takes the session environment'
  process = run_command(CASES[name].command, *args)
  line = one_error_line(process, CASES[name].says.format(**places))
  assert folder_contents(tmp_path / 'case') == before
  forked, forked_places = outcomes[name][0], outcomes[name][1]
  expected = forked.stderr.strip()
  for key, value in forked_places.items():
    if key != 'refused_port':
      expected = expected.replace(value, places[key])
  assert line == expected


@pytest.mark.slow
def test_a_run_under_home_is_made_there_and_keeps_the_expanded_paths(
    run_command, tmp_path, monkeypatch
):
  """`--workdir=~/run` as the shell passes it (it expands `~` only at the
  start of a word): an import writes $HOME/run, its config.json holds the
  expanded paths, and no folder named `~` is made in the working directory."""
  monkeypatch.setenv('HOME', str(tmp_path))
  process = run_command(
      'import_checkpoint',
      *IMPORT,
      '--workdir=~/run',
      '--config.data.cache_dir=~/cache',
      '--config.data.path=~/books',
  )
  assert process.returncode == 0, process.stderr
  saved = json.loads((tmp_path / 'run' / 'config.json').read_text())
  assert saved['data']['cache_dir'] == str(tmp_path / 'cache')
  assert saved['data']['path'] == str(tmp_path / 'books')
  assert not (REPO_ROOT / '~').exists()


@pytest.mark.slow
def test_evaluate_scores_the_restore_step_and_moves_nothing(runs, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(runs['masked'], workdir)
  before = folder_contents(workdir)
  config = tiny_config(restore_step=10)
  results = evaluation.evaluate_run(config, workdir, 'validation')
  assert results['step'] == 10
  path = evaluation.results_path(typed(config).loop, workdir, 'validation')
  assert path == os.path.join(workdir, 'eval_validation_10.json')
  evaluation.write_results(path, results)
  after = folder_contents(workdir)
  assert after.pop('eval_validation_10.json') and after == before
  newest = evaluation.evaluate_run(tiny_config(), workdir, 'validation')
  assert newest['step'] == 20 and newest['loss'] != results['loss']


@pytest.mark.slow
def test_generate_samples_with_the_restore_step(runs):
  config = tiny_config(**CAUSAL_FIELDS, restore_step=1)
  first = text_generation.continue_prompt(config, runs['causal'], 'the', 4, temperature=0)
  newest = text_generation.continue_prompt(tiny_config(**CAUSAL_FIELDS), runs['causal'], 'the', 4)
  assert (first.step, newest.step) == (1, 2)


# The refusals themselves, in-process (fast): each message in one line.


@pytest.mark.parametrize(
    'settings, words',
    [
        ((-1, 1.0, 0), 'max_new_tokens=-1 is not allowed'),
        ((0, 1.0, 0), 'max_new_tokens=0 is not allowed'),
        ((4, float('nan'), 0), 'temperature=nan is not allowed'),
        ((4, float('-inf'), 0), 'temperature=-inf is not allowed'),
        ((4, -1.0, 0), 'temperature=-1.0 is not allowed'),
        ((4, 1.0, -2), 'top_k=-2 is not allowed'),
        ((4, 1.0, 261), 'top_k=261 is more than the 260 tokens'),
    ],
)
def test_sampling_settings_are_refused_naming_them(settings, words):
  with pytest.raises(ValueError, match=words) as error:
    generation.check_sampling(*settings, vocab_size=260)
  assert '\n' not in str(error.value)


# What ml_collections raises for an unknown --config.PATH override.
TYPO = KeyError('\'restor_step\'\nDid you mean "restore_step" instead of "restor_step"?')
NESTED_TYPO = KeyError(
    '\'projected_lenn\'\nDid you mean "projected_len" instead of "projected_lenn"?'
)
INSIDE_A_NUMBER = KeyError(
    "Attribute <class 'int'>.x does not exist and the type does not support indexing. "
    'Attempting to lookup: model.projected_len.x'
)


@pytest.mark.parametrize(
    'error, override, words',
    [
        (
            AttributeError(TYPO),
            '--config.restor_step=3',
            "--config.restor_step=3: config has no field 'restor_step'; did you mean "
            'config.restore_step? (--helpconfig lists every field)',
        ),
        (
            AttributeError(NESTED_TYPO),
            '--config.model.projected_lenn=3',
            "--config.model.projected_lenn=3: config.model has no field 'projected_lenn'; did you "
            'mean config.model.projected_len? (--helpconfig lists every field)',
        ),
        (
            KeyError("'nope'"),
            '--config.nope.x=1',
            "--config.nope.x=1: config has no field 'nope' (--helpconfig lists every field)",
        ),
        (
            INSIDE_A_NUMBER,
            '--config.model.projected_len.x=3',
            "--config.model.projected_len.x=3: config.model.projected_len has no field 'x' "
            '(--helpconfig lists every field)',
        ),
    ],
)
def test_an_unknown_config_key_is_named_in_words(error, override, words):
  argv = ['evaluate', '--config=configs/tiny.py', override, '--workdir=/tmp/run']
  assert flag_errors.flag_error_words(error, argv) == words


def test_sampling_settings_at_their_limits_are_accepted():
  generation.check_sampling(1, 0.0, 260, vocab_size=260)
  generation.check_sampling(1, 1e-3, 0)


def test_a_folder_check_refuses_a_file_and_a_path_inside_one(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('x')
  with pytest.raises(ConfigError, match=r"--out='.*a_file' cannot be a folder \(it is a file\)"):
    storage.check_folder(str(blocker), '--out')
  with pytest.raises(ConfigError, match=f'it is inside the file {blocker}'):
    storage.check_folder(str(blocker / 'below'), writable=False)
  storage.check_folder(str(tmp_path / 'new' / 'deeper'))
  assert sorted(os.listdir(tmp_path)) == ['a_file']


@pytest.fixture
def no_store_variables(monkeypatch):
  for name in EMULATOR_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_an_object_store_without_credentials_is_refused_in_one_line(no_store_variables):
  no_store_variables.setenv('GOOGLE_APPLICATION_CREDENTIALS', '/nonexistent/key.json')
  with pytest.raises(ConfigError) as error:
    storage.check_reachable('gs://bucket/run')
  assert str(error.value) == (
      '--workdir=gs://bucket/run: no Google Cloud credentials (File /nonexistent/key.json was not '
      'found): run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS '
      'to a key file, or give a local --workdir.'
  )


def test_an_object_store_that_refuses_is_named_at_once(no_store_variables):
  no_store_variables.setenv('STORAGE_EMULATOR_HOST', f'http://127.0.0.1:{free_port()}')
  with pytest.raises(ConfigError, match='cannot be reached \\(Connection refused\\): check '):
    storage.check_reachable('gs://bucket/run', timeout_s=5)


def test_an_object_store_that_never_answers_is_given_up_after_the_timeout(no_store_variables):
  """A listening socket nobody serves: the connection opens, no answer comes."""
  with socket.socket() as silent:
    silent.bind(('127.0.0.1', 0))
    silent.listen()
    url = f'http://127.0.0.1:{silent.getsockname()[1]}'
    no_store_variables.setenv('STORAGE_EMULATOR_HOST', url)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=f'{url} (gave no answer|cannot be reached)'):
      storage.check_reachable('gs://bucket/run', timeout_s=0.5)
    assert time.monotonic() - start < 5


def test_local_paths_need_no_object_store(no_store_variables):
  no_store_variables.setenv('GOOGLE_APPLICATION_CREDENTIALS', '/nonexistent/key.json')
  storage.check_reachable('/tmp/run')
