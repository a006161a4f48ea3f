"""docs/api.md runs as written: its Python blocks, in order as one session from
the repository root, on the session's tiny run (the `tiny_run` fixture:
configs/tiny.py trained once, kept steps 10 and 20), its /tmp/tiny moved to
that run's copy and /tmp/tiny_hf to a fresh folder. The comment lines ending a
block are what the block's last lines print (the run's folder printed as
/tmp/tiny): the page's figures, shapes and messages are the API's own.
"""

import contextlib
import io
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGE = REPO / 'docs' / 'api.md'


def python_blocks():
  return re.findall(r'```python\n(.*?)```', PAGE.read_text(), flags=re.S)


def expected_lines(block):
  """The comment lines that end a block: what it prints last."""
  lines = block.rstrip().splitlines()
  expected = []
  while lines and lines[-1].startswith('# '):
    expected.insert(0, lines.pop()[2:])
  return expected


def test_the_page_has_blocks_that_say_what_they_print():
  blocks = python_blocks()
  assert len(blocks) >= 10
  assert sum(bool(expected_lines(block)) for block in blocks) >= 10


@pytest.fixture(scope='module')
def page_run(tiny_run, tmp_path_factory, monkeypatch_module):
  """(block, what it printed) for every block of the page, in order."""
  workdir, _ = tiny_run
  folder = tmp_path_factory.mktemp('api_docs')
  monkeypatch_module.chdir(REPO)
  namespace, printed_by_block = {}, []
  for number, block in enumerate(python_blocks()):
    source = block.replace("'/tmp/tiny_hf'", repr(str(folder / 'tiny_hf')))
    source = source.replace("'/tmp/tiny'", repr(workdir))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      exec(compile(source, f'docs/api.md block {number}', 'exec'), namespace)  # pylint: disable=exec-used
    printed_by_block.append((block, printed.getvalue().replace(workdir, '/tmp/tiny')))
  return printed_by_block


@pytest.fixture(scope='module')
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as patch:
    yield patch


def test_every_block_prints_what_the_page_says(page_run):
  for block, printed in page_run:
    expected = expected_lines(block)
    if expected:
      last = printed.rstrip('\n').splitlines()[-len(expected) :]
      assert last == expected, block
