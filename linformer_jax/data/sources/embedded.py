"""The embedded corpus: English documentation shipped inside Python itself.

The pydoc topics and the standard library's docstrings need no network and no
download, so they are the default pretraining corpus. Measured with CPython
3.11.7: train 357 documents, 1.72 M characters (372 k tokens with an
8000-piece SentencePiece model); validation 23 documents, 0.098 M characters
(22 k tokens). Extraction takes under a second, once, in a child interpreter;
later runs read a JSON cache. It is config.data.source='embedded', with the
splits 'train' and 'validation'.
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

from linformer_jax.data import cache
from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.sources import base
from linformer_jax.errors import ConfigError

EMBEDDED_SPLITS = ('train', 'validation')
# Documents shorter than this are mostly one-line docstrings ("Return self.");
# they add little text and a separator token per handful of words.
MIN_DOCUMENT_CHARS = 200
# Share of embedded documents, in thousandths, that go to the validation split.
VALIDATION_PER_MILLE = 50

# Standard-library modules never imported for the embedded corpus: they open
# windows or browsers, print on import, write files (lib2to3's grammar cache),
# replace themselves (distutils under setuptools) or are the test suite.
_SKIPPED_MODULES = frozenset(
    {
        'antigravity',
        'distutils',
        'idlelib',
        'lib2to3',
        'readline',
        'test',
        'this',
        'tkinter',
        'turtle',
        'turtledemo',
    }
)


def split_of_title(title: str) -> str:
  """'validation' for about VALIDATION_PER_MILLE/1000 of titles, else 'train'.

  A hash of the title (not Python's salted `hash`) keeps the assignment the
  same in every process, run and Python version.
  """
  digest = hashlib.sha256(title.encode('utf-8')).digest()
  bucket = int.from_bytes(digest[:8], 'big') % 1000
  return 'validation' if bucket < VALIDATION_PER_MILLE else 'train'


def embedded_documents(split: str, cache_dir: Optional[str] = None) -> List[str]:
  """Python's own English documentation, as documents of one split.

  One document per pydoc topic (`pydoc_data.topics`) and one per standard
  library module (its docstring followed by those of its public classes,
  methods and functions). A module and all its docstrings go to one split.

  Args:
    split: 'train' or 'validation'.
    cache_dir: where the extracted documents are cached as JSON, one file per
      Python version (default ~/.cache/linformer_jax).

  Returns:
    The split's documents, in a fixed order.
  """
  if split not in EMBEDDED_SPLITS:
    raise ConfigError(
        f"Split {split!r} does not exist for config.data.source='embedded'; "
        f'set config.data.train_split/eval_split to one of {EMBEDDED_SPLITS}.'
    )
  return [
      text
      for title, text in _embedded_titled_documents(cache_dir)
      if split_of_title(title) == split
  ]


@base.REGISTRY.register('embedded')
class Embedded(base.PretrainingSource):
  """Python's own documentation (`embedded_documents`), cached in config.data.cache_dir."""

  def documents(self, data_config: DataConfig, split: str) -> Iterator[str]:
    return iter(embedded_documents(split, data_config.cache_dir or None))

  def signature(self, data_config: DataConfig, split: str) -> Dict[str, Any]:
    """The Python version, whose documentation the corpus is."""
    del data_config, split
    return {'python': list(sys.version_info[:3])}


def _embedded_titled_documents(cache_dir: Optional[str]) -> List[Tuple[str, str]]:
  """All (title, text) pairs, extracted once per Python version and cached."""
  version = '.'.join(map(str, sys.version_info[:3]))
  cache_file = cache.cache_root(cache_dir) / f'embedded_docs_py{version}.json'
  if not cache_file.exists():
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache_file.with_suffix(f'.tmp{os.getpid()}')
    # Importing ~250 modules has side effects (threads, signal handlers,
    # warnings, global state), so a fresh interpreter does it, not this one.
    # Isolated (-I): neither the current folder nor PYTHONPATH comes first on
    # sys.path, so a file named like a standard module (a `tabnanny.py` where
    # the command runs) is never imported in its place; the package is
    # appended after the standard library.
    package_parent = str(pathlib.Path(__file__).resolve().parents[3])
    subprocess.run(
        [
            sys.executable,
            '-I',
            '-W',
            'ignore',
            '-c',
            'import sys; sys.path.append(sys.argv[2]); '
            'from linformer_jax.data.sources import embedded; '
            'embedded._write_embedded_documents(sys.argv[1])',
            str(temporary),
            package_parent,
        ],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    os.replace(temporary, cache_file)  # atomic: concurrent runs never see half
  return [tuple(pair) for pair in json.loads(cache_file.read_text('utf-8'))]


def _write_embedded_documents(path: str) -> None:
  """Runs in a child interpreter: extracts all documents into a JSON file."""
  import pydoc_data.topics  # pylint: disable=g-import-not-at-top

  documents = [
      (f'topic:{name}', text.strip()) for name, text in sorted(pydoc_data.topics.topics.items())
  ]
  seen = set()
  for name in _stdlib_module_names():
    module = _import_quietly(name)
    if module is not None:
      documents.append((f'module:{name}', _module_text(module, seen)))
  kept, texts = [], set()
  for title, text in documents:
    # Some pydoc topics are aliases ('if' and 'else' share a text); a text in
    # two titles could land in both splits.
    if len(text) >= MIN_DOCUMENT_CHARS and text not in texts:
      texts.add(text)
      kept.append((title, text))
  pathlib.Path(path).write_text(json.dumps(kept), 'utf-8')


def _stdlib_module_names() -> List[str]:
  """Public standard-library modules and their public submodules, sorted."""
  import pkgutil  # pylint: disable=g-import-not-at-top

  names = []
  for name in sorted(sys.stdlib_module_names):
    if name.startswith('_') or name in _SKIPPED_MODULES:
      continue
    names.append(name)
    module = _import_quietly(name)
    for info in pkgutil.walk_packages(
        getattr(module, '__path__', []), prefix=f'{name}.', onerror=lambda _: None
    ):
      parts = info.name.split('.')
      if not any(part.startswith('_') or part in ('test', 'tests', 'idle_test') for part in parts):
        names.append(info.name)
  return sorted(set(names))


def _import_quietly(name: str):
  """The module, or None if importing it fails or writes to stdout/stderr."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top

  output = io.StringIO()
  try:
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
      module = importlib.import_module(name)
  except KeyboardInterrupt:  # Ctrl-C or SIGTERM (interrupts): the command stops
    raise
  except BaseException:  # pylint: disable=broad-except
    # SystemExit and friends too: some modules refuse to load on this platform.
    return None
  return None if output.getvalue() else module


def _module_text(module, seen: set) -> str:
  """The module docstring, then each public class/function docstring once."""
  import inspect  # pylint: disable=g-import-not-at-top

  parts = []

  def add(title: str, obj) -> None:
    doc = obj.__doc__ if isinstance(getattr(obj, '__doc__', None), str) else None
    if doc:
      doc = inspect.cleandoc(doc)
      # Aliases and re-exports share docstrings; keep each text once.
      if doc not in seen:
        seen.add(doc)
        parts.append(f'{title}\n\n{doc}' if title else doc)

  add('', module)
  for name, obj in sorted(vars(module).items()):
    owner = getattr(obj, '__module__', None) or ''
    # Objects of C accelerators (heapq.heappush from _heapq) are documented
    # under the public module that re-exports them; other imports are not.
    if name.startswith('_') or not (owner == module.__name__ or owner.startswith('_')):
      continue
    if inspect.isclass(obj):
      add(f'class {name}', obj)
      for member_name, member in sorted(vars(obj).items()):
        if not member_name.startswith('_') and (
            inspect.isroutine(member) or isinstance(member, property)
        ):
          add(f'{name}.{member_name}', member)
    elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
      add(name, obj)
  return '\n\n'.join(parts)
