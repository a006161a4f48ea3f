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
import os

from absl import flags

from linformer_jax import cli
from linformer_jax.data import book_passages

_BOOKS = '../shared/data/gutenberg'
_DEFAULTS = book_passages.PassageSettings()
FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags: defined when it runs, so that importing it defines none."""
  flags.DEFINE_list(
      'books',
      [f'{_BOOKS}/pg768.txt', f'{_BOOKS}/pg8374.txt', f'{_BOOKS}/pg2496.txt'],
      'Text files, one per class (the agreed Gutenberg test books).',
  )
  flags.DEFINE_string('out', None, 'Folder to write train.tsv, dev.tsv and test.tsv into.')
  flags.DEFINE_integer('min_words', _DEFAULTS.min_words, 'A passage is at least this many words.')
  flags.DEFINE_integer('max_words', _DEFAULTS.max_words, 'A passage is cut after this many words.')
  flags.DEFINE_float(
      'train_share', _DEFAULTS.train_share, "Share of each book's passages to train."
  )
  flags.DEFINE_float('validation_share', _DEFAULTS.validation_share, 'Next share: validation.')
  flags.DEFINE_integer('seed', _DEFAULTS.seed, 'Seed of the choice that balances the books.')


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  if not FLAGS.out:
    cli.fail('--out is required: the folder to write the task into.')
  existing = [
      name
      for name in book_passages.FILE_OF_SPLIT.values()
      if os.path.exists(os.path.join(FLAGS.out, name))
  ]
  if existing:
    cli.fail(f'{FLAGS.out} already holds {", ".join(existing)}; remove them or pick another --out.')
  settings = book_passages.PassageSettings(
      min_words=FLAGS.min_words,
      max_words=FLAGS.max_words,
      train_share=FLAGS.train_share,
      validation_share=FLAGS.validation_share,
      seed=FLAGS.seed,
  )
  rows = book_passages.build(FLAGS.books, settings)
  paths = book_passages.write(rows, FLAGS.out)
  for split, path in paths.items():
    counts = collections.Counter(label for _, label in rows[split])
    words = sum(len(passage.split()) for passage, _ in rows[split]) / len(rows[split])
    summary = f'{len(rows[split]):,} passages ({dict(counts)}), {words:.1f} words each on average'
    print(f'{split}: {summary}, in {path}')


if __name__ == '__main__':
  define_flags()
  cli.run(main)
