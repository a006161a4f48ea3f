"""docs/extending.md's whole path, run as written: a projection with weights in a
file of its own, trained, resumed, evaluated, analysed from its folder alone,
loaded in Python, and swept.

Every command of the section runs as `python -m linformer_jax.X ...`, forked
one after another from one process that imported the libraries once
(tests/command_runner.py), with the page's /tmp folders moved into the test's
own; its Python block runs in this process. The page's printed lines are what
the tests check. The page's other commands, each training a part of its own,
run for 2 steps (`long`: `make test-all`).
"""

import contextlib
import io
import json
import math
import os
import re
import shlex

import numpy as np
import pytest
from run_helpers import REPO_ROOT
from run_helpers import final_params
from run_helpers import run_forked_commands
from test_extending_data import write_jsonl_corpus

from linformer_jax.training import run_builder

SECTION = '## The whole path'
pytestmark = pytest.mark.slow  # every test reads the walked path's runs


def section_blocks():
  """(language, text) of each fenced block of the section, in order."""
  text = (REPO_ROOT / 'docs' / 'extending.md').read_text()
  start = text.index(SECTION)
  section = text[start : text.index('\n## ', start + 1)]
  return re.findall(r'```([a-z]*)\n(.*?)```', section, flags=re.S)


def commands_of(block):
  """The argument lists of a shell block's commands, continuations joined."""
  lines = block.replace('\\\n', ' ').splitlines()
  return [shlex.split(line) for line in lines if line.strip()]


@pytest.fixture(scope='module')
def walked(tmp_path_factory):
  """{'folder', 'commands': [(module, args, result)], 'printed': the Python
  block's stdout and its expected last line}."""
  folder = tmp_path_factory.mktemp('walk')

  def moved(text):
    return text.replace('/tmp/convex', str(folder / 'convex'))  # and /tmp/convex_sweep

  cases, python_blocks = [], []
  for language, block in section_blocks():
    if language == 'python':
      python_blocks.append(moved(block))
      continue
    for arguments in commands_of(moved(block)):
      assert arguments[:2] == ['python', '-m'], arguments
      module = arguments[2].split('.', 1)[1]
      cases.append({'module': module, 'args': arguments[3:], 'env': {}})
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT), 'JAX_PLATFORMS': 'cpu'}
  results = run_forked_commands(cases, folder, env)
  (block,) = python_blocks
  printed = io.StringIO()
  with contextlib.chdir(REPO_ROOT), contextlib.redirect_stdout(printed):
    exec(compile(block, 'docs/extending.md', 'exec'), {})  # pylint: disable=exec-used
  expected = block.strip().splitlines()[-1].lstrip('# ')
  commands = [(case['module'], case['args'], result) for case, result in zip(cases, results)]
  return {'folder': folder, 'commands': commands, 'printed': (printed.getvalue(), expected)}


def test_the_section_runs_every_command_the_path_needs(walked):
  modules = [module for module, _, _ in walked['commands']]
  assert modules == ['train', 'train', 'evaluate', 'spectrum', 'projection_stats', 'sweep']
  for module, args, result in walked['commands']:
    assert result['returncode'] == 0, (module, args, result['stdout'][-2000:], result['stderr'])
    assert 'Traceback' not in result['stderr'], result['stderr']


def test_the_second_command_resumes_the_first_runs_checkpoint(walked):
  (_, _, first), (_, _, second) = walked['commands'][:2]
  assert 'after 10 steps' in first['stdout']
  assert 'Resumed from the checkpoint of step 10' in second['stdout']
  assert 'after 20 steps' in second['stdout']


def test_commands_given_the_folder_alone_read_the_runs_own_config(walked):
  by_module = {module: (args, result) for module, args, result in walked['commands'][2:]}
  for module in ('evaluate', 'spectrum', 'projection_stats'):
    assert not any(arg.startswith('--config') for arg in by_module[module][0]), module
  evaluated = by_module['evaluate'][1]['stdout']
  results = json.loads(evaluated[evaluated.index('{') :])
  assert results['step'] == 20 and math.isfinite(results['eval_perplexity'])
  saved = json.loads((walked['folder'] / 'convex' / 'eval_validation.json').read_text())
  assert saved['eval_perplexity'] == results['eval_perplexity']
  assert (walked['folder'] / 'convex' / 'spectrum' / 'spectrum.json').is_file()


def test_projection_stats_describes_the_softmax_not_the_logits(walked):
  report = json.loads((walked['folder'] / 'convex' / 'projection_stats.json').read_text())
  assert report['projection'] == 'convex' and report['step'] == 20
  ((path, stats),) = report['learned'].items()
  assert path.endswith('kv_projection')
  assert stats['slot_sum'] == pytest.approx(1, abs=1e-5)
  assert stats['negative'] == 0 and 0 < stats['drift']
  assert report['initial'] == {}  # the 'linear' kind's draws say nothing of logits
  assert report['projection_init'] == 'not used'  # the kind draws its logits itself
  assert 'slot sum +1.000' in walked['commands'][4][2]['stdout']


def test_the_python_block_loads_the_run_with_its_extension(walked):
  printed, expected = walked['printed']
  said, result = printed.strip().splitlines()
  # Loading says which file of extensions it imported: the original, still there.
  original = REPO_ROOT / 'docs' / 'examples' / 'convex_projection.py'
  run = walked['folder'] / 'convex'
  assert said == f"Extensions of {run}: {original} (the original, identical to the run's copy)."
  assert result == expected


def test_the_sweep_trains_each_part_with_its_declared_setting(walked):
  sweep = walked['folder'] / 'convex_sweep'
  report = (sweep / 'results.md').read_text()
  for name in ('linear', 'convex-tempered'):
    assert f'| {name} |' in report, report
    saved = json.loads((sweep / name / 'config.json').read_text())
    assert saved['total_steps'] == 8
  tempered = json.loads((sweep / 'convex-tempered' / 'config.json').read_text())
  assert tempered['model']['temperature_init'] == 2.0
  assert tempered['model']['attention'] == 'tempered_linformer'
  # Both parts' own weights trained: each temperature left 2.
  workdir = str(sweep / 'convex-tempered')
  with contextlib.chdir(REPO_ROOT):  # the run's extensions are paths from the root
    step, params = final_params(workdir, run_builder.saved_config(workdir))
  assert step == 8
  for layer in ('layers_0', 'layers_1'):
    log_temperature = params['encoder'][layer]['attention']['log_temperature']
    assert np.all(np.abs(log_temperature - math.log(2.0)) > 1e-6), log_temperature


@pytest.mark.long
def test_every_other_command_of_the_page_trains_as_written(tmp_path):
  """The page's other commands (the strided projection, the scaled attention,
  the JSON-lines source, the shuffled-text task) as written, for 2 steps, the
  JSON-lines one on a corpus of its own: each trains and says so."""
  text = (REPO_ROOT / 'docs' / 'extending.md').read_text()
  start = text.index(SECTION)
  outside = text[:start] + text[text.index('\n## ', start + 1) :]
  corpus = write_jsonl_corpus(tmp_path / 'corpus')
  short = ['total_steps=2', 'warmup_steps=1', 'eval_every=2', 'checkpoint_every=2']
  cases = []
  shell_blocks = [
      b for lang, b in re.findall(r'```([a-z]*)\n(.*?)```', outside, flags=re.S) if not lang
  ]
  for block in shell_blocks:
    for arguments in commands_of(block.replace('path/to/folder', str(corpus))):
      assert arguments[:3] == ['python', '-m', 'linformer_jax.train'], arguments
      workdir = arguments.index('--workdir') + 1
      arguments[workdir] = str(tmp_path / os.path.basename(arguments[workdir]))
      cases.append(
          {'module': 'train', 'args': arguments[3:] + [f'--config.{s}' for s in short], 'env': {}}
      )
  assert len(cases) == 4, cases
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT), 'JAX_PLATFORMS': 'cpu'}
  for case, result in zip(cases, run_forked_commands(cases, tmp_path, env)):
    assert result['returncode'] == 0, (case['args'], result['stdout'][-2000:], result['stderr'])
    assert 'after 2 steps' in result['stdout'], result['stdout'][-2000:]
