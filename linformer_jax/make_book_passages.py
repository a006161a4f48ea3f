"""Writes a short-text task from books: which book is a passage from?

  python -m linformer_jax.make_book_passages --out runs/data/book_passages

By default the books are the three test books of ../shared/data/gutenberg
(Wuthering Heights, Alton Locke, Our Village), which pretraining on
configs/gutenberg.py never reads. Writes OUT/train.tsv, dev.tsv and test.tsv
(`sentence<TAB>label`, the label being the book's file name), balanced over
the books and split by position within each book
(`linformer_jax.data.book_passages`); configs/finetune_book_passages.py
fine-tunes on them. Bad flags, a missing book, or an --out that already holds
the files end with a one-line error and exit code 2, writing nothing.
"""

import collections
import dataclasses
import os
from typing import Sequence

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.data import book_passages
from linformer_jax.settings_flags import setting

_BOOKS = '../shared/data/gutenberg'


@dataclasses.dataclass(frozen=True)
class TaskFiles:
  """Where the task's passages come from and go; the passages' own settings
  are `book_passages.PassageSettings`, flags too."""

  books: Sequence[str] = setting(
      (f'{_BOOKS}/pg768.txt', f'{_BOOKS}/pg8374.txt', f'{_BOOKS}/pg2496.txt'),
      'Text files, one per class (the agreed Gutenberg test books).',
  )
  out: str = setting('', 'Folder to write train.tsv, dev.tsv and test.tsv into.')


def define_flags() -> None:
  settings_flags.define_flags(TaskFiles)
  settings_flags.define_flags(book_passages.PassageSettings)


def main(_):
  files = settings_flags.from_flags(TaskFiles)
  settings = settings_flags.from_flags(book_passages.PassageSettings)
  if not files.out:
    cli.fail('--out is required: the folder to write the task into.')
  existing = [
      name
      for name in book_passages.FILE_OF_SPLIT.values()
      if os.path.exists(os.path.join(files.out, name))
  ]
  if existing:
    cli.fail(f'{files.out} already holds {", ".join(existing)}; remove them or pick another --out.')
  rows = book_passages.build(list(files.books), settings)
  paths = book_passages.write(rows, files.out)
  for split, path in paths.items():
    counts = collections.Counter(label for _, label in rows[split])
    words = sum(len(passage.split()) for passage, _ in rows[split]) / len(rows[split])
    summary = f'{len(rows[split]):,} passages ({dict(counts)}), {words:.1f} words each on average'
    print(f'{split}: {summary}, in {path}')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
