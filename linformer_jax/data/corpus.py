"""Text sources for pretraining; each gives one split's documents, streamed.

* `embedded.embedded_documents`: English documentation shipped inside Python
  itself, the default corpus (see `embedded`).
* `split_text_files`, `file_documents`: local text files, e.g. Project Gutenberg books, with
  whole files assigned to splits and the Gutenberg header/footer stripped.
* `iter_tfds_documents`: any TFDS text dataset (wiki40b, pg19, lm1b, ...) that the
  machine has prepared, or may download.

`iter_documents(config.data, split)` streams the documents of the source
`config.data.source` names; `load_documents` lists them (for small data).
Documents are returned in a deterministic order; splits are fixed by titles or
file names, never by random state, so every run sees the same data.
"""

import os
import pathlib
import re
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from linformer_jax.errors import ConfigError

SOURCES = ('embedded', 'text_files', 'tfds')
# Text files are cut into documents of about this many characters at paragraph
# boundaries: SentencePiece trains on them and packing separates them with eos.
TEXT_FILE_DOCUMENT_CHARS = 4000
# Text files larger than this are read in blocks of this size, cut at blank
# lines, so that one huge file never has to fit in memory.
FILE_BLOCK_BYTES = 32 * 2**20
_BLANK_LINE = re.compile(rb'\n[ \t\r\f\v]*\n')
DEFAULT_CACHE_DIR = '~/.cache/linformer_jax'
# Environment variable that moves the default cache (config.data.cache_dir
# still wins): the test suite points it at a fresh folder.
CACHE_DIR_VARIABLE = 'LINFORMER_JAX_CACHE_DIR'


def cache_root(cache_dir: Optional[str] = None) -> pathlib.Path:
  """The cache folder: `cache_dir` if set, else $LINFORMER_JAX_CACHE_DIR, else
  ~/.cache/linformer_jax.

  Checked, not created: it must be a folder that can be written, or one that
  can be made (the first existing folder on its path can be written).

  Raises:
    ConfigError: it cannot be the cache; the message names the path and the
      setting it came from.
  """
  if cache_dir:
    setting = f'config.data.cache_dir={cache_dir!r}'
    fix = 'set config.data.cache_dir to a folder you can write to'
  elif os.environ.get(CACHE_DIR_VARIABLE):
    setting = f'${CACHE_DIR_VARIABLE}={os.environ[CACHE_DIR_VARIABLE]!r}'
    fix = f'point ${CACHE_DIR_VARIABLE} at a folder you can write to, or set config.data.cache_dir'
  else:
    setting = f'the default data cache {DEFAULT_CACHE_DIR}'
    fix = f'set config.data.cache_dir or ${CACHE_DIR_VARIABLE} to a folder you can write to'
  root = pathlib.Path(
      os.path.expanduser(cache_dir or os.environ.get(CACHE_DIR_VARIABLE) or DEFAULT_CACHE_DIR)
  )
  existing = root
  while not os.path.lexists(existing) and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    where = '' if existing == root else f', and {root} would lie inside it'
    problem = f'{existing} is a file, not a folder{where}'
  elif not os.access(existing, os.W_OK | os.X_OK):
    problem = f'{existing} is a folder you cannot write to'
  else:
    return root
  raise ConfigError(f'{setting} cannot be the data cache: {problem}; {fix}.')


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


def _after_blank_line(f, offset: int) -> int:
  """The offset just past the first blank line at or after `offset` (0 stays 0;
  the end of the file when there is none), reading 64 KiB at a time."""
  if offset == 0:
    return 0
  f.seek(offset)
  position, tail = offset, b''
  while True:
    data = f.read(1 << 16)
    if not data:
      return position + len(tail)
    buffer = tail + data
    match = _BLANK_LINE.search(buffer)
    if match:
      return position + match.end()
    keep = min(len(buffer), 256)  # enough for a blank line split between reads
    position += len(buffer) - keep
    tail = buffer[len(buffer) - keep :]


def file_blocks(path: pathlib.Path) -> int:
  """How many blocks `file_documents` reads the file in (1 up to FILE_BLOCK_BYTES)."""
  return max(1, -(-path.stat().st_size // FILE_BLOCK_BYTES))


def block_documents(path: pathlib.Path, index: int) -> List[str]:
  """The documents of block `index` of a large file: from the first blank line
  at or after index * FILE_BLOCK_BYTES to the first one at or after the next
  block's start, so neighbouring blocks meet exactly; UTF-8, with undecodable
  bytes replaced."""
  with open(path, 'rb') as f:
    start = _after_blank_line(f, index * FILE_BLOCK_BYTES)
    end = _after_blank_line(f, (index + 1) * FILE_BLOCK_BYTES)
    f.seek(start)
    raw = f.read(max(end - start, 0))
  text = raw.decode('utf-8', errors='replace').replace('\r\n', '\n').replace('\r', '\n')
  return paragraph_documents(text)


def file_documents(path: pathlib.Path) -> List[str]:
  """One text file's documents, cut at blank lines into documents of about
  TEXT_FILE_DOCUMENT_CHARS characters, Gutenberg boilerplate removed.

  A file over FILE_BLOCK_BYTES (no book is) is read block by block instead
  (`block_documents`), so it never has to fit in memory: a document also ends
  at each block's end, and the boilerplate is not looked for.
  """
  if path.stat().st_size > FILE_BLOCK_BYTES:
    return [doc for index in range(file_blocks(path)) for doc in block_documents(path, index)]
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
    from linformer_jax.data import embedded  # pylint: disable=g-import-not-at-top

    return iter(embedded.embedded_documents(split, data_config.get('cache_dir') or None))
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
