"""The package's layering: every import points down, commands stay thin."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'linformer_jax'
# What each layer may import from the package, besides the base modules below.
ALLOWED = {
    'model': {'model'},
    'data': {'data'},
    'training': {'training', 'model', 'data'},
    'analysis': {'analysis', 'training', 'model', 'data'},
}
# Modules below every layer: error types and the registries of named parts.
BASE_MODULES = ('errors', 'registry')
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
    'pooling_probe',
    'generate',
    'causal_benchmark',
    'pytorch_comparison',
    'import_checkpoint',
)


def package_imports(path):
  """The linformer_jax modules a file imports, as dotted names below the package."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('linformer_jax'):
      module = node.module.split('.')[1:]
      names.update(
          '.'.join(module + [alias.name]) if not module else '.'.join(module)
          for alias in node.names
      )
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


def test_commands_are_top_level_modules_that_nothing_imports():
  for command in COMMANDS:
    assert (PACKAGE / f'{command}.py').exists(), command
  for path in sorted(PACKAGE.rglob('*.py')):
    for name in package_imports(path):
      assert (
          name.split('.')[0] not in COMMANDS
      ), f'{path.relative_to(PACKAGE.parent)} imports the command linformer_jax.{name}'
