"""Text sources for pretraining; each gives one split's documents, streamed.

* `embedded_documents`: English documentation shipped inside Python itself (the
  pydoc topics and the standard library's docstrings). Needs no network and no
  download, so it is the default corpus. Measured with CPython 3.11.7: train
  357 documents, 1.72 M characters (372 k tokens with an 8000-piece
  SentencePiece model); validation 23 documents, 0.098 M characters (22 k
  tokens). Extraction takes under a second, once; later runs read a JSON cache.
* `split_text_files`, `file_documents`: local text files, e.g. Project Gutenberg books, with
  whole files assigned to splits and the Gutenberg header/footer stripped.
* `iter_tfds_documents`: any TFDS text dataset (wiki40b, pg19, lm1b, ...) that the
  machine has prepared, or may download.

`iter_documents(config.data, split)` streams the documents of the source
`config.data.source` names; `load_documents` lists them (for small data).
Documents are returned in a deterministic order; splits are fixed by titles or
file names, never by random state, so every run sees the same data.
"""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from linformer_jax.errors import ConfigError

SOURCES = ('embedded', 'text_files', 'tfds')
EMBEDDED_SPLITS = ('train', 'validation')
# Documents shorter than this are mostly one-line docstrings ("Return self.");
# they add little text and a separator token per handful of words.
MIN_DOCUMENT_CHARS = 200
# Share of embedded documents, in thousandths, that go to the validation split.
VALIDATION_PER_MILLE = 50
# Text files are cut into documents of about this many characters at paragraph
# boundaries: SentencePiece trains on them and packing separates them with eos.
TEXT_FILE_DOCUMENT_CHARS = 4000
DEFAULT_CACHE_DIR = '~/.cache/linformer_jax'
# Environment variable that moves the default cache (config.data.cache_dir
# still wins): the test suite points it at a fresh folder.
CACHE_DIR_VARIABLE = 'LINFORMER_JAX_CACHE_DIR'

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


def cache_root(cache_dir: Optional[str] = None) -> pathlib.Path:
  """The cache folder: `cache_dir` if set, else $LINFORMER_JAX_CACHE_DIR, else
  ~/.cache/linformer_jax."""
  return pathlib.Path(
      os.path.expanduser(cache_dir or os.environ.get(CACHE_DIR_VARIABLE) or DEFAULT_CACHE_DIR)
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


def _embedded_titled_documents(cache_dir: Optional[str]) -> List[Tuple[str, str]]:
  """All (title, text) pairs, extracted once per Python version and cached."""
  version = '.'.join(map(str, sys.version_info[:3]))
  cache_file = cache_root(cache_dir) / f'embedded_docs_py{version}.json'
  if not cache_file.exists():
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache_file.with_suffix(f'.tmp{os.getpid()}')
    # Importing ~250 modules has side effects (threads, signal handlers,
    # warnings, global state), so a fresh interpreter does it, not this one.
    package_parent = str(pathlib.Path(__file__).resolve().parents[1])
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get('PYTHONPATH')])),
    )
    subprocess.run(
        [
            sys.executable,
            '-W',
            'ignore',
            '-c',
            'import sys; from linformer_jax.data import corpus; '
            'corpus._write_embedded_documents(sys.argv[1])',
            str(temporary),
        ],
        env=env,
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


# Line-anchored, case-insensitive markers of Project Gutenberg boilerplate.
_GUTENBERG_START = re.compile(
    r'^\s*(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG E-?BOOK.*|\*END\*THE SMALL PRINT.*)$',
    re.IGNORECASE | re.MULTILINE,
)
_GUTENBERG_END = re.compile(
    r'^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG E-?BOOK'
    r'|END OF (THE )?PROJECT GUTENBERG)',
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg_boilerplate(text: str) -> str:
  """The book without the Project Gutenberg header and licence footer.

  The header ends at the last `*** START OF THE PROJECT GUTENBERG EBOOK ...`
  (or older `*END*THE SMALL PRINT...`) line; the footer starts at the first
  `*** END OF THE PROJECT GUTENBERG EBOOK` (or `End of (the) Project
  Gutenberg's ...`) line after it. Text without markers is returned unchanged.
  """
  start = 0
  for match in _GUTENBERG_START.finditer(text):
    if not _GUTENBERG_END.search(text, start, match.start()):
      start = match.end()
  end_match = _GUTENBERG_END.search(text, start)
  end = end_match.start() if end_match else len(text)
  return text[start:end]


def paragraph_documents(text: str, target_chars: int = TEXT_FILE_DOCUMENT_CHARS) -> List[str]:
  """Groups blank-line separated paragraphs into documents of ~target_chars.

  Hard line wrapping inside a paragraph is undone (it is typesetting, not
  text); paragraphs inside a document stay separated by a newline.
  """
  documents, current, size = [], [], 0
  for block in re.split(r'\n\s*\n', text):
    paragraph = ' '.join(block.split())
    if not paragraph:
      continue
    current.append(paragraph)
    size += len(paragraph) + 1
    if size >= target_chars:
      documents.append('\n'.join(current))
      current, size = [], 0
  if current:
    documents.append('\n'.join(current))
  return documents


def _read_text(path: pathlib.Path) -> str:
  """Decodes UTF-8 (BOM or not), Windows-1252 or Latin-1; newlines become \\n."""
  raw = path.read_bytes()
  # Older Gutenberg files are Windows-1252; Latin-1 decodes any byte string.
  for encoding in ('utf-8-sig', 'cp1252', 'latin-1'):
    try:
      text = raw.decode(encoding)
      break
    except UnicodeDecodeError:
      continue
  return text.replace('\r\n', '\n').replace('\r', '\n')


def list_text_files(path: str) -> List[pathlib.Path]:
  """The file at `path`, or the sorted .txt files of the folder at `path`."""
  root = pathlib.Path(os.path.expanduser(path)) if path else None
  if root is None or not root.exists():
    raise ConfigError(
        f'config.data.path={path!r} does not exist; set it to a text '
        'file or a folder of .txt files.'
    )
  files = sorted(root.glob('*.txt')) if root.is_dir() else [root]
  if not files:
    raise ConfigError(
        f'config.data.path={path!r} holds no .txt files; set it to a '
        'text file or a folder of .txt files.'
    )
  return files


def split_text_files(
    path: str, split: str, split_files: Mapping[str, Sequence[str]]
) -> List[pathlib.Path]:
  """The text files of one split; whole files never cross splits.

  Args:
    path: a text file or a folder of .txt files.
    split: 'train' (every file not listed in split_files) or a key of
      split_files.
    split_files: split name -> file names (as in the folder), e.g.
      {'validation': ['pg345.txt'], 'test': ['pg768.txt']}.
  """
  files = list_text_files(path)
  split_files = {name: list(names) for name, names in (split_files or {}).items()}
  if 'train' in split_files:
    raise ConfigError(
        "config.data.split_files must not list 'train'; the train "
        'split is every file not listed there.'
    )
  available = {file.name for file in files}
  assigned: Dict[str, str] = {}
  for split_name, names in sorted(split_files.items()):
    for name in names:
      if name not in available:
        raise ConfigError(
            f'config.data.split_files[{split_name!r}] lists {name!r}, '
            f'which is not a .txt file in config.data.path={path!r}.'
        )
      if name in assigned:
        raise ConfigError(
            f'config.data.split_files lists {name!r} in both '
            f'{assigned[name]!r} and {split_name!r}.'
        )
      assigned[name] = split_name
  if split != 'train' and split not in split_files:
    raise ConfigError(
        f'Split {split!r} is not in config.data.split_files (splits: '
        f'{sorted(split_files)}); add it there or change '
        'config.data.train_split/eval_split.'
    )
  chosen = [file for file in files if assigned.get(file.name, 'train') == split]
  if not chosen:
    raise ConfigError(
        f'Split {split!r} of config.data.path={path!r} has no text; '
        'check config.data.path and config.data.split_files.'
    )
  return chosen


def file_documents(path: pathlib.Path) -> List[str]:
  """One text file's documents: Gutenberg boilerplate removed, cut into
  documents of about TEXT_FILE_DOCUMENT_CHARS characters at blank lines."""
  return paragraph_documents(strip_gutenberg_boilerplate(_read_text(path)))


def text_file_documents(
    path: str, split: str, split_files: Mapping[str, Sequence[str]]
) -> List[str]:
  """Documents of one split of local text files (see `split_text_files`), in memory."""
  documents = [
      doc for file in split_text_files(path, split, split_files) for doc in file_documents(file)
  ]
  if not documents:
    raise ConfigError(
        f'Split {split!r} of config.data.path={path!r} has no text; '
        'check config.data.path and config.data.split_files.'
    )
  return documents


# Structure markers of wiki40b's text, turned back into plain text.
_WIKI40B_MARKERS = re.compile(r'\n?_START_(ARTICLE|SECTION|PARAGRAPH)_\n')


def tfds_examples(
    name: str,
    split: str,
    features: Sequence[str],
    data_dir: Optional[str] = None,
    download: bool = False,
    field: str = 'config.data.tfds_text_key',
) -> Iterable[Dict[str, Any]]:
  """The examples (numpy dicts) of a prepared TFDS split, checked first.

  Args:
    name: TFDS name, with config if any ('wiki40b/en', 'glue/sst2').
    split: TFDS split ('train', 'validation', 'test', or a slice 'train[:1%]').
    features: the features the caller reads; a missing one is an error.
    data_dir: TFDS data_dir (None or '' for the TFDS default).
    download: download and prepare the dataset if missing. Off by default:
      without network TFDS retries for minutes before failing.
    field: the config field that names `features`, for the error message.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    builder = tfds.builder(name, data_dir=data_dir or None)
  except tfds.core.registered.DatasetNotFoundError as error:
    raise ConfigError(f'config.data.tfds_name={name!r} is not a TFDS dataset.') from error
  if not builder.is_prepared():
    if not download:
      raise ConfigError(
          f'TFDS dataset {name!r} is not prepared in config.data.tfds_data_dir='
          f'{data_dir!r}; set config.data.tfds_download=True (needs network) or '
          'prepare it there with `tfds build`.'
      )
    builder.download_and_prepare()
  base_split = split.split('[')[0]
  if base_split not in builder.info.splits:
    raise ConfigError(
        f'TFDS dataset {name!r} has no split {base_split!r} (it has '
        f'{sorted(builder.info.splits)}); change '
        'config.data.train_split/eval_split.'
    )
  for feature in features:
    if feature not in builder.info.features:
      raise ConfigError(
          f'{field}: {feature!r} is not a feature of {name!r} '
          f'(features: {sorted(builder.info.features)}).'
      )
  return tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))


def tfds_text(example: Mapping[str, Any], text_key: str) -> str:
  """The plain text of a TFDS example (wiki40b's structure markers undone)."""
  text = example[text_key]
  text = text.decode('utf-8') if isinstance(text, bytes) else str(text)
  return _WIKI40B_MARKERS.sub('\n', text).replace('_NEWLINE_', '\n').strip()


def iter_tfds_documents(
    name: str,
    split: str,
    text_key: str = 'text',
    data_dir: Optional[str] = None,
    download: bool = False,
) -> Iterator[str]:
  """Documents of a TFDS text dataset, e.g. 'wiki40b/en', 'pg19', 'lm1b', streamed
  one example at a time; see `tfds_examples` for the arguments."""
  found = False
  for example in tfds_examples(name, split, [text_key], data_dir, download):
    text = tfds_text(example, text_key)
    if text:
      found = True
      yield text
  if not found:
    raise ConfigError(
        f'Split {split!r} of TFDS dataset {name!r} has no text in '
        f'feature config.data.tfds_text_key={text_key!r}.'
    )


def iter_documents(data_config: Mapping[str, Any], split: str) -> Iterator[str]:
  """The documents of `split` from the source `config.data.source` names, streamed:
  text files are read one at a time, TFDS examples one by one."""
  source = data_config['source']
  if source == 'embedded':
    return iter(embedded_documents(split, data_config.get('cache_dir') or None))
  if source == 'text_files':
    files = split_text_files(data_config['path'], split, data_config.get('split_files') or {})
    return (document for file in files for document in file_documents(file))
  if source == 'tfds':
    if not data_config.get('tfds_name'):
      raise ConfigError(
          "config.data.tfds_name is empty; set it to a TFDS dataset, e.g. 'wiki40b/en'."
      )
    return iter_tfds_documents(
        data_config['tfds_name'],
        split,
        data_config.get('tfds_text_key') or 'text',
        data_config.get('tfds_data_dir') or None,
        bool(data_config.get('tfds_download', False)),
    )
  raise ConfigError(f'config.data.source={source!r} is not allowed; use one of {SOURCES}.')


def load_documents(data_config: Mapping[str, Any], split: str) -> List[str]:
  """All documents of `split` in memory (see `iter_documents`); for small data."""
  return list(iter_documents(data_config, split))
