"""The README and docs/ stay true to the tree: the module map of
docs/layout.md names every module, docs/training.md documents every config
field, every command and `--config.` field the pages mention exists, and the
README states no figure that no command regenerates (test counts, suite
times)."""

import ast
import importlib
import pathlib
import re
import textwrap

import ml_collections
import pytest

from linformer_jax import registry
from linformer_jax.extensions import import_extensions

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / 'linformer_jax'
LAYOUT_PAGE = REPO / 'docs' / 'layout.md'
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md'))]
# Config fields holding a mapping whose keys are data (split -> files), not fields.
MAPPING_FIELDS = ('data.split_files',)
COMMAND = re.compile(r'python -m linformer_jax\.([a-z_]+)((?:[^`\n]|\\\n)*)')


def _fenced_blocks(text):
  return re.findall(r'```[^\n]*\n(.*?)```', text, flags=re.S)


def _module_map():
  """The "Where things live" code block of docs/layout.md."""
  section = LAYOUT_PAGE.read_text().split('## Where things live', 1)[1]
  return _fenced_blocks(section)[0]


def _mapped_modules(block):
  """The package paths (relative to linformer_jax/) the map names. A line whose
  first entry ends in '/' opens a folder for the lines indented below it; a
  bare `name.py` is in the open folder (or the package root), and
  `folder/a.py, b.py` names folder/b.py too."""
  named, folder_at = set(), []  # folder_at: (indent, folder) of open folders
  for line in block.splitlines():
    if not line.strip() or line.strip().startswith('linformer_jax/'):
      continue
    indent = len(line) - len(line.lstrip())
    folder_at = [(i, f) for i, f in folder_at if i < indent]
    first = line.split()[0]
    if first.endswith('/') and not first.endswith('.py'):
      parent = folder_at[-1][1] if folder_at else ''
      folder_at.append((indent, parent + first))
      continue
    folder = folder_at[-1][1] if folder_at else ''
    for entry in re.findall(r'[\w/]+\.py', line):
      if '/' in entry:
        folder = folder + entry.rsplit('/', 1)[0] + '/'
        entry = entry.rsplit('/', 1)[1]
      named.add(folder + entry)
  return named


def _modules():
  """Every module of the package, as a path below linformer_jax/; an
  __init__.py only where it holds more than a docstring."""
  modules = set()
  for path in PACKAGE.rglob('*.py'):
    if path.name == '__init__.py':
      body = [n for n in _top_level_nodes(path) if not _is_docstring(n)]
      if not body:
        continue
    modules.add(path.relative_to(PACKAGE).as_posix())
  return modules


def _top_level_nodes(path):
  return ast.parse(path.read_text()).body


def _is_docstring(node):
  return isinstance(node, ast.Expr) and isinstance(getattr(node, 'value', None), ast.Constant)


def _flat_fields(config, prefix=''):
  fields = set()
  for key, value in config.items():
    path = prefix + key
    if isinstance(value, ml_collections.ConfigDict) and len(value) and path not in MAPPING_FIELDS:
      fields |= _flat_fields(value, path + '.')
    else:
      fields.add(path)
  return fields


def _config_files():
  return sorted(
      path
      for path in (REPO / 'configs').glob('*.py')
      if path.stem not in ('__init__', 'from_workdir')  # from_workdir reads a run's config.json
  )


@pytest.fixture(scope='module')
def fields_by_config():
  """Every config file's fields, as dotted paths."""
  fields = {}
  for path in _config_files():
    config = importlib.import_module(f'configs.{path.stem}').get_config()
    fields[f'configs/{path.name}'] = _flat_fields(config)
  return fields


def test_the_module_map_names_every_module_and_nothing_else():
  named, modules = _mapped_modules(_module_map()), _modules()
  where = 'docs/layout.md\'s "Where things live"'
  assert not modules - named, f'{where} misses {sorted(modules - named)}'
  assert not named - modules, f'{where} names {sorted(named - modules)}'


def test_training_docs_document_every_config_field(fields_by_config):
  text = (REPO / 'docs' / 'training.md').read_text()
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  documented = set(re.findall(r'`([^`\n]+)`', text))
  every_field = set().union(*fields_by_config.values())
  missing = sorted(every_field - documented)
  assert not missing, f'docs/training.md documents no {missing}; add a row to its field tables'


def _commands():
  """(page, command, arguments) of every `python -m linformer_jax.X` in the pages
  and the configs' docstrings, with continued lines joined."""
  sources = PAGES + _config_files() + sorted((REPO / 'configs' / 'sweeps').glob('*.py'))
  for page in sources:
    text = page.read_text().replace('\\\n', ' ')
    for command, arguments in COMMAND.findall(text):
      yield page.relative_to(REPO).as_posix(), command, arguments


def test_every_command_in_the_docs_exists():
  commands = list(_commands())
  assert len(commands) > 50
  for page, command, _ in commands:
    assert (PACKAGE / f'{command}.py').is_file(), f'{page} runs linformer_jax.{command}'


def _declared_fields(arguments):
  """The config.model and config.data fields that the parts of a command's
  --config.extensions declare (`registry.Setting`), as dotted paths."""
  extensions = re.search(r'--config\.extensions="(\([^"]*\))"', arguments)
  if not extensions:
    return set()
  import_extensions(ast.literal_eval(extensions.group(1)))
  return {
      f'{section}.{name}'
      for section in ('model', 'data')
      for name in registry.declared_settings(f'config.{section}')
  }


def test_every_config_field_set_in_the_docs_exists(fields_by_config):
  every_field = set().union(*fields_by_config.values())
  checked = 0
  for page, command, arguments in _commands():
    config = re.search(r'--config[= ](configs/\w+\.py)', arguments)
    fields = fields_by_config.get(config.group(1), every_field) if config else every_field
    fields = fields | _declared_fields(arguments)
    for field in re.findall(r'--config\.([\w.]+)', arguments):
      checked += 1
      assert field in fields or any(
          field.startswith(f + '.') for f in MAPPING_FIELDS
      ), f'{page}: linformer_jax.{command} sets --config.{field}, which its config lacks'
  assert checked > 20


def test_the_readme_states_no_figure_of_the_suite():
  readme = (REPO / 'README.md').read_text()
  assert not re.search(r'\d[\d,]* tests\b', readme), 'the README counts the tests'
  assert not re.search(r'make test\S*`? [^.\n]*\d+ (?:s|seconds|minutes)\b', readme)


def _table_cells(row):
  """The cells of a Markdown table row: split at each `|` that is neither
  escaped nor inside backticks, without the outer pipes."""
  cells, cell, in_code, escaped = [], '', False, False
  for char in row.strip():
    if escaped or char == '\\':
      escaped = not escaped
    elif char == '`':
      in_code = not in_code
    elif char == '|' and not in_code:
      cells.append(cell)
      cell = ''
      continue
    cell += char
  cells.append(cell)
  if row.strip().startswith('|'):
    cells = cells[1:]
  if row.strip().endswith('|') and not row.strip().endswith('\\|'):
    cells = cells[:-1]
  return cells


DELIMITER_ROW = re.compile(r'^\|?(\s*:?-+:?\s*\|)+(\s*:?-+:?\s*)?$')


def _tables(text):
  """((line number, header cells), [(line number, cells) of the delimiter row
  and of each row below it]) for each table outside fenced code."""
  lines = re.sub(r'```.*?```', lambda m: '\n' * m.group().count('\n'), text, flags=re.S)
  lines = lines.splitlines()
  for at, line in enumerate(lines[:-1]):
    if '|' in line and DELIMITER_ROW.match(lines[at + 1].strip()):
      header, rows = (at + 1, _table_cells(line)), [(at + 2, _table_cells(lines[at + 1]))]
      for below in range(at + 2, len(lines)):
        if not lines[below].strip().startswith('|'):
          break
        rows.append((below + 1, _table_cells(lines[below])))
      yield header, rows


def test_every_table_has_as_many_cells_in_each_row_as_in_its_header():
  """A delimiter row of another width leaves the table as plain text on
  GitHub; a longer row loses its last cells."""
  tables = 0
  for page in PAGES:
    for (at, header), rows in _tables(page.read_text()):
      tables += 1
      for row_at, cells in rows:
        assert len(cells) == len(header), (
            f"{page.relative_to(REPO)}:{row_at} has {len(cells)} cells, its table's header"
            f' (line {at}) {len(header)}'
        )
  assert tables > 50


def test_training_docs_allow_registered_kinds_for_projection_and_attention():
  rows = {
      row.split('|')[1].strip(): row
      for row in (REPO / 'docs' / 'training.md').read_text().splitlines()
      if row.startswith('| `model.')
  }
  for field in ('`model.projection`', '`model.attention`'):
    assert 'registered in a file named in `extensions`' in rows[field], rows[field]


def _example_sources():
  return [path.read_text() for path in sorted((REPO / 'docs' / 'examples').glob('*.py'))]


# Blocks that read a trained run: tests/test_api_docs.py and
# tests/test_extending_walkthrough.py run them on one.
TRAINED_RUN_BLOCK = "linformer_jax.load('/tmp/"


def test_every_python_block_of_extending_is_an_example_excerpt_or_runs(monkeypatch):
  """A block is either code of a docs/examples file (which the tests import),
  one that reads a trained run /tmp/RUN (run by the tests that train it), or a
  snippet that runs as it stands, from the repository root."""
  monkeypatch.chdir(REPO)
  sources = _example_sources()
  text = (REPO / 'docs' / 'extending.md').read_text()
  blocks = re.findall(r'```python\n(.*?)```', text, flags=re.S)
  assert len(blocks) >= 4
  for block in blocks:
    excerpt = textwrap.dedent(block)
    indents = ('', '  ', '    ')
    if any(textwrap.indent(excerpt, indent) in source for source in sources for indent in indents):
      continue
    if TRAINED_RUN_BLOCK in block:
      continue
    exec(compile(block, 'docs/extending.md', 'exec'), {})  # pylint: disable=exec-used
