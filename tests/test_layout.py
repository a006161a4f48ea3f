"""The package's layering: every import points down, commands stay thin."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'linformer_jax'
# What each layer may import from the package, besides the base modules below.
ALLOWED = {
    'model': {'model'},
    'data': {'data'},
    'checkpoints': {'checkpoints', 'model', 'data'},
    'training': {'training', 'checkpoints', 'model', 'data'},
    'analysis': {'analysis', 'training', 'checkpoints', 'model', 'data'},
}
# Modules below every layer: error types, the registries of named parts, the
# importing of the files config.extensions names (so that their parts register;
# the training layer imports a run's), the path layer (local folders and gs://),
# the units of memory, settings dataclasses whose fields are flags, and the
# handling of Ctrl-C and SIGTERM that a training loop takes over, and the
# layout of a run folder.
BASE_MODULES = (
    'errors',
    'registry',
    'extensions',
    'storage',
    'units',
    'settings_flags',
    'interrupts',
    'run_folder',
)
# The Python API (api.py: linformer_jax.load and build) sits on the training
# layer, beside analysis: the commands may import it, no layer does.
API_ALLOWED = {'training', 'checkpoints', 'model', 'data'}
COMMANDS = (
    'train',
    'evaluate',
    'prepare_data',
    'data_benchmark',
    'benchmark',
    'spectrum',
    'sweep',
    'mesh_memory',
    'attention_benchmark',
    'rival_benchmark',
    'pooling_probe',
    'listops_shortcuts',
    'generate',
    'causal_benchmark',
    'pytorch_comparison',
    'import_checkpoint',
    'export_checkpoint',
    'projection_stats',
    'make_book_passages',
    'matmul_dtypes',
)


def package_imports(path):
  """What a file imports from linformer_jax, as dotted names below the package.

  `from linformer_jax.training import trainer` gives 'training.trainer', and
  `from linformer_jax.errors import ConfigError` gives 'errors.ConfigError':
  a module, or a name inside one.
  """
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('linformer_jax'):
      module = node.module.split('.')[1:]
      names.update('.'.join(module + [alias.name]) for alias in node.names)
    elif isinstance(node, ast.Import):
      names.update(
          alias.name.split('.', 1)[1]
          for alias in node.names
          if alias.name.startswith('linformer_jax.')
      )
  return names


@pytest.mark.parametrize('layer', sorted(ALLOWED))
def test_each_layer_imports_only_itself_and_the_layers_below(layer):
  for path in sorted((PACKAGE / layer).glob('*.py')):
    for name in package_imports(path):
      top = name.split('.')[0]
      assert (
          top in BASE_MODULES or top in ALLOWED[layer]
      ), f'{path.relative_to(PACKAGE.parent)} imports linformer_jax.{name}'


def test_the_python_api_imports_only_the_layers_below_it():
  for name in package_imports(PACKAGE / 'api.py'):
    top = name.split('.')[0]
    assert top in BASE_MODULES or top in API_ALLOWED, f'linformer_jax/api.py imports {name}'


def test_every_module_that_runs_a_main_is_a_listed_command():
  running = {path.stem for path in PACKAGE.glob('*.py') if 'cli.run(main)' in path.read_text()}
  assert running == set(COMMANDS), f'add to or drop from COMMANDS: {running ^ set(COMMANDS)}'


def test_commands_are_top_level_modules_that_nothing_imports():
  for command in COMMANDS:
    assert (PACKAGE / f'{command}.py').exists(), command
  for path in sorted(PACKAGE.rglob('*.py')):
    for name in package_imports(path):
      assert (
          name.split('.')[0] not in COMMANDS
      ), f'{path.relative_to(PACKAGE.parent)} imports the command linformer_jax.{name}'


# The commands whose own flags are the fields of a settings dataclass.
# The commands with settings of their own (train and matmul_dtypes take the
# run config's alone): each declares them once, as a settings dataclass.
SETTINGS_COMMANDS = tuple(c for c in COMMANDS if c not in ('train', 'matmul_dtypes'))


def called_names(path):
  """The dotted names a file calls, e.g. 'cli.run' and 'flags.DEFINE_list'."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call):
      parts, target = [], node.func
      while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
      if isinstance(target, ast.Name):
        names.add('.'.join([target.id] + parts[::-1]))
  return names


@pytest.mark.parametrize('command', COMMANDS)
def test_every_command_runs_its_main_through_cli(command):
  # cli.run turns bad input into one line and exit code 2.
  assert 'cli.run' in called_names(PACKAGE / f'{command}.py')


@pytest.mark.parametrize('command', COMMANDS)
def test_a_command_is_one_module_and_defines_its_flags_when_it_runs(command):
  # Its logic is in the command's own module (with the shared machinery of
  # analysis/), not split over a command and a library of the same name.
  assert not (PACKAGE / 'analysis' / f'{command}.py').exists()
  source = (PACKAGE / f'{command}.py').read_text()
  assert source.rstrip().endswith("if __name__ == '__main__':\n  define_flags()\n  cli.run(main)")


@pytest.mark.parametrize('command', COMMANDS)
def test_no_command_reads_positional_arguments(command):
  # cli.run refuses them for every command, before its main runs.
  tree = ast.parse((PACKAGE / f'{command}.py').read_text())
  (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'main']
  assert [arg.arg for arg in main.args.args] == ['_']


def test_cli_run_refuses_a_positional_argument_before_main_runs():
  script = 'from linformer_jax import cli; cli.run(lambda _: print("main ran"))'
  result = subprocess.run(
      [sys.executable, '-c', script, 'extra'],
      cwd=PACKAGE.parent,
      capture_output=True,
      text=True,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert result.returncode == 2
  assert "unexpected arguments ['extra']; pass settings as --FLAG=VALUE" in result.stderr
  assert 'main ran' not in result.stdout


def test_importing_the_commands_defines_no_flag():
  # So that tests, notebooks and other code import a command's functions freely.
  imports = '; '.join(f'import linformer_jax.{command}' for command in COMMANDS)
  script = (
      f'from absl import flags; {imports}; '
      'print(sorted(module for module in flags.FLAGS.flags_by_module_dict() '
      "if module.startswith('linformer_jax')))"
  )
  result = subprocess.run(
      [sys.executable, '-c', script],
      cwd=PACKAGE.parent,
      capture_output=True,
      text=True,
      check=True,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert result.stdout.strip() == '[]'


@pytest.mark.parametrize('command', SETTINGS_COMMANDS)
def test_commands_take_their_flags_from_their_settings_only(command):
  calls = called_names(PACKAGE / f'{command}.py')
  assert 'settings_flags.define_flags' in calls and 'settings_flags.from_flags' in calls
  by_hand = sorted(
      name
      for name in calls
      if name.rpartition('.')[2].startswith(('DEFINE', 'mark_flag')) and not name.startswith('cli.')
  )
  assert not by_hand, f'{command}.py defines flags itself: {by_hand}'


def _module_of(path):
  """The dotted name of a file below the package, e.g. 'training.trainer'."""
  parts = path.relative_to(PACKAGE).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def module_graph():
  """Module -> the package's modules it imports, for every file of the package.

  `from linformer_jax.training import trainer` names the module
  'training.trainer'; `from linformer_jax.errors import ConfigError` names
  'errors.ConfigError', which is cut back to the module 'errors'.
  """
  modules = {_module_of(path): path for path in PACKAGE.rglob('*.py')}
  graph = {}
  for module, path in modules.items():
    targets = set()
    for name in package_imports(path):
      while name and name not in modules:
        name = name.rpartition('.')[0]
      if name and name != module:
        targets.add(name)
    graph[module] = targets
  return graph


def find_cycle(graph):
  """One cycle of `graph` as a list of modules (first == last), or None."""
  finished, on_path = set(), []

  def visit(module):
    on_path.append(module)
    for target in sorted(graph[module]):
      if target in on_path:
        return on_path[on_path.index(target) :] + [target]
      if target not in finished:
        cycle = visit(target)
        if cycle:
          return cycle
    on_path.pop()
    finished.add(module)
    return None

  for module in sorted(graph):
    if module not in finished:
      cycle = visit(module)
      if cycle:
        return cycle
  return None


def test_find_cycle_reports_the_modules_of_a_cycle():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']


def test_no_two_modules_of_the_package_import_each_other_even_through_others():
  graph = module_graph()
  assert 'training.trainer' in graph['train']  # the graph sees `from ... import module`
  cycle = find_cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_config_fields_are_read_without_defaults_of_their_own():
  # config.get(FIELD, DEFAULT) repeats configs/default.py and drifts from it; a
  # config saved before FIELD existed gets it from run_config.complete, the one shim.
  reads = [
      f'{path.relative_to(PACKAGE)}:{number}'
      for path in sorted(PACKAGE.rglob('*.py'))
      for number, line in enumerate(path.read_text().splitlines(), 1)
      if 'config.get(' in line
  ]
  assert not reads
