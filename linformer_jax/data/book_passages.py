"""A short-text classification task made from books: which book is a passage from?

Each book (its Project Gutenberg header and licence footer removed) is cut
into paragraphs at blank lines, each paragraph into sentences, and runs of
whole sentences into passages of at least `min_words` words; a passage longer
than `max_words` is cut there. A book's passages are split by position, the
first `train_share` for training, then the validation and test shares, so
that no split holds a neighbour of another split's passage. Each split keeps
as many passages of every book as its smallest book has there (a seeded
choice), so the majority class is 1 / (number of books).

The files are TSVs with a header, `sentence<TAB>label`, the label being the
book's file name without `.txt`: the format of configs/finetune_sst2.py.
"""

import dataclasses
import os
import re
from typing import Dict, List, Sequence

import numpy as np

from linformer_jax.data.sources import text_files
from linformer_jax.errors import ConfigError
from linformer_jax.settings_flags import setting

SPLITS = ('train', 'validation', 'test')
FILE_OF_SPLIT = {'train': 'train.tsv', 'validation': 'dev.tsv', 'test': 'test.tsv'}
# The space after a sentence: after . ! or ?, perhaps closed by a quote or bracket.
_SENTENCE_END = re.compile(r'(?:(?<=[.!?])|(?<=[.!?]["\'\u201d\u2019)\]]))\s+')
_BLANK_LINE = re.compile(r'\n\s*\n')


@dataclasses.dataclass(frozen=True)
class PassageSettings:
  min_words: int = setting(8, 'A passage is whole sentences of at least this many words.')
  max_words: int = setting(40, 'A passage is cut after this many words.')
  train_share: float = setting(0.7, "Share of each book's passages to train, in reading order.")
  validation_share: float = setting(
      0.15, 'The next share: validation; the rest are the test split.'
  )
  seed: int = setting(0, 'Seed of the choice of passages that balances the books.')

  def check(self) -> None:
    if not 1 <= self.min_words <= self.max_words:
      raise ConfigError(
          f'min_words={self.min_words}, max_words={self.max_words}: give '
          '1 <= min_words <= max_words.'
      )
    shares = (self.train_share, self.validation_share)
    if not all(0 < share < 1 for share in shares) or sum(shares) >= 1:
      raise ConfigError(
          f'train_share={self.train_share}, validation_share={self.validation_share}: '
          'each must be in (0, 1) and leave a share for the test split.'
      )


def passages(text: str, settings: PassageSettings) -> List[str]:
  """The passages of one book's text, in reading order, one line each."""
  found = []
  for paragraph in _BLANK_LINE.split(text):
    words_so_far: List[str] = []
    for sentence in _SENTENCE_END.split(' '.join(paragraph.split())):
      words_so_far.extend(sentence.split())
      if len(words_so_far) >= settings.min_words:
        found.append(' '.join(words_so_far[: settings.max_words]))
        words_so_far = []
  return found


def split_by_position(items: Sequence[str], settings: PassageSettings) -> Dict[str, List[str]]:
  """A book's passages cut into the splits in reading order."""
  train_end = int(len(items) * settings.train_share)
  validation_end = int(len(items) * (settings.train_share + settings.validation_share))
  return {
      'train': list(items[:train_end]),
      'validation': list(items[train_end:validation_end]),
      'test': list(items[validation_end:]),
  }


def build(book_paths: Sequence[str], settings: PassageSettings) -> Dict[str, List[tuple]]:
  """Each split's (passage, label) rows, every book equally often."""
  settings.check()
  if len(book_paths) < 2:
    raise ConfigError(f'{len(book_paths)} book(s) given: the task needs two or more.')
  labels = [os.path.splitext(os.path.basename(path))[0] for path in book_paths]
  if len(set(labels)) != len(labels):
    raise ConfigError(f'Two books share a file name ({labels}); the names are the labels.')
  by_book = {}
  for path, label in zip(book_paths, labels):
    if not os.path.isfile(path):
      raise ConfigError(f'{path} is not a file; pass the books as text files.')
    with open(path, encoding='utf-8', errors='replace') as f:
      text = text_files.strip_gutenberg_boilerplate(f.read())
    by_book[label] = split_by_position(passages(text, settings), settings)
  rng = np.random.default_rng(settings.seed)
  rows = {}
  for split in SPLITS:
    size = min(len(splits[split]) for splits in by_book.values())
    if size == 0:
      short = [label for label, splits in by_book.items() if not splits[split]]
      raise ConfigError(f'{", ".join(short)} has no {split} passage; pass longer books.')
    rows[split] = []
    for label, splits in by_book.items():
      chosen = sorted(rng.choice(len(splits[split]), size, replace=False))
      rows[split].extend((splits[split][i], label) for i in chosen)
    order = rng.permutation(len(rows[split]))
    rows[split] = [rows[split][i] for i in order]
  return rows


def write(rows: Dict[str, List[tuple]], folder: str) -> Dict[str, str]:
  """Writes each split as FILE_OF_SPLIT[split] in folder; returns the paths."""
  os.makedirs(folder, exist_ok=True)
  paths = {}
  for split, split_rows in rows.items():
    paths[split] = os.path.join(folder, FILE_OF_SPLIT[split])
    with open(paths[split], 'w', encoding='utf-8') as f:
      f.write('sentence\tlabel\n')
      for passage, label in split_rows:
        f.write(f'{passage}\t{label}\n')
  return paths
