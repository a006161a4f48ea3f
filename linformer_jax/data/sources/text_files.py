"""Local text files as a pretraining source (config.data.source='text_files').

config.data.path is a text file or a folder of .txt files (e.g. Project
Gutenberg books); config.data.split_files assigns whole files to splits by
name, the train split being every other file. Each file is cut at blank lines
into documents of about TEXT_FILE_DOCUMENT_CHARS characters, its Gutenberg
header and licence footer removed. A unit is one file, or one block of
FILE_BLOCK_BYTES of a larger file, so no file has to fit in memory.
"""

import dataclasses
import os
import pathlib
import re
from typing import Dict, Iterator, List, Mapping, Sequence

from linformer_jax.data.data_config import DataConfig
from linformer_jax.data.sources import base
from linformer_jax.errors import ConfigError
from linformer_jax.units import MIB

# Text files are cut into documents of about this many characters at paragraph
# boundaries: SentencePiece trains on them and packing separates them with eos.
TEXT_FILE_DOCUMENT_CHARS = 4000
# Text files larger than this are read in blocks of this size, cut at blank
# lines, so that one huge file never has to fit in memory.
FILE_BLOCK_BYTES = 32 * MIB
_BLANK_LINE = re.compile(rb'\n[ \t\r\f\v]*\n')


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
  if path and '://' in path:
    raise ConfigError(
        f'config.data.path={path!r} is a URL; text files are read from a local folder: copy '
        'them to this machine.'
    )
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


@dataclasses.dataclass(frozen=True)
class TextFile(base.Unit):
  """A whole text file of at most FILE_BLOCK_BYTES."""

  path: str

  def documents(self) -> List[str]:
    return file_documents(pathlib.Path(self.path))

  def size(self) -> int:
    return os.path.getsize(self.path)


@dataclasses.dataclass(frozen=True)
class FileBlock(base.Unit):
  """Block `index` of a text file over FILE_BLOCK_BYTES (see `block_documents`)."""

  path: str
  index: int

  def documents(self) -> List[str]:
    return block_documents(pathlib.Path(self.path), self.index)

  def size(self) -> int:
    return FILE_BLOCK_BYTES


@base.REGISTRY.register('text_files')
class TextFiles(base.PretrainingSource):
  """config.data.path's text files, split by config.data.split_files."""

  samples_whole_units = True

  def documents(self, data_config, split) -> Iterator[str]:
    files = _files_of(data_config, split)
    return (document for file in files for document in file_documents(file))

  def units(self, data_config, split) -> Iterator[base.Unit]:
    for path in _files_of(data_config, split):
      if path.stat().st_size <= FILE_BLOCK_BYTES:
        yield TextFile(str(path))
      else:
        for index in range(file_blocks(path)):
          yield FileBlock(str(path), index)

  def signature(self, data_config, split) -> Dict[str, object]:
    """Each file's path, size and modification time (never its contents), and
    the split assignment."""
    del split  # every split depends on all files: train is "all the others"
    files = list_text_files(data_config.path)
    return {
        'files': [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
        'split_files': {k: sorted(v) for k, v in dict(data_config.split_files).items()},
    }


def _files_of(data_config: DataConfig, split: str) -> List[pathlib.Path]:
  return split_text_files(data_config.path, split, data_config.split_files)
