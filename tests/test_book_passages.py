"""The book-passage task (`make_book_passages`): passages of whole sentences,
split by position within each book, balanced, and readable by the classifier's
TSV reader with configs/finetune_book_passages.py's labels."""

import os

import pytest

from configs import finetune_book_passages
from linformer_jax.data import book_passages
from linformer_jax.data import labelled_examples
from linformer_jax.errors import ConfigError

SETTINGS = book_passages.PassageSettings()


def write_book(folder, name, sentences):
  """A Gutenberg-style book: header, paragraphs of numbered sentences that
  name the book, licence footer."""
  paragraphs = []
  for start in range(0, sentences, 5):
    paragraphs.append(
        ' '.join(
            f'In {name} sentence {i} says\nfour more words here.'
            for i in range(start, min(start + 5, sentences))
        )
    )
  text = (
      'Title page\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n'
      + '\n\n'.join(paragraphs)
      + '\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicence text.\n'
  )
  path = folder / f'{name}.txt'
  path.write_text(text, encoding='utf-8')
  return str(path)


@pytest.fixture
def three_books(tmp_path):
  return [write_book(tmp_path, name, n) for name, n in (('pg1', 400), ('pg2', 300), ('pg3', 500))]


def test_a_passage_is_whole_sentences_of_at_least_min_words_cut_at_max_words():
  text = (
      'One two three. Four five six seven. Eight nine.\n\n'
      'Ten eleven "twelve thirteen." Fourteen fifteen sixteen seventeen!'
  )
  settings = book_passages.PassageSettings(min_words=4, max_words=5)
  assert book_passages.passages(text, settings) == [
      'One two three. Four five',  # 3 + 4 words, cut at 5
      'Ten eleven "twelve thirteen."',  # a paragraph never continues the last; quotes stay
      'Fourteen fifteen sixteen seventeen!',
  ]  # 'Eight nine.' is under 4 words at the paragraph's end and is dropped


def test_splits_follow_reading_order_and_every_book_is_equally_frequent(three_books):
  rows = book_passages.build(three_books, SETTINGS)
  for split in book_passages.SPLITS:
    counts = {label: 0 for label in ('pg1', 'pg2', 'pg3')}
    for passage, label in rows[split]:
      counts[label] += 1
      assert 'GUTENBERG' not in passage and '\t' not in passage and '\n' not in passage
      assert passage.startswith(f'In {label} sentence')
    assert len(set(counts.values())) == 1, counts
  # Every train passage of a book comes before its validation passages, which
  # come before its test passages (sentence numbers rise through the book).
  first_number = lambda passage: int(passage.split()[3])
  for label in ('pg1', 'pg2', 'pg3'):
    numbers = [
        [first_number(text) for text, book in rows[split] if book == label]
        for split in book_passages.SPLITS
    ]
    assert max(numbers[0]) < min(numbers[1]) and max(numbers[1]) < min(numbers[2])
  # The smallest book (pg2, 300 sentences of 8 words: 300 passages) sets each split's size.
  assert len(rows['train']) == 3 * int(300 * SETTINGS.train_share)


def test_the_same_seed_gives_the_same_files_and_another_seed_another_choice(three_books):
  rows = book_passages.build(three_books, SETTINGS)
  assert book_passages.build(three_books, SETTINGS) == rows
  other = book_passages.build(three_books, book_passages.PassageSettings(seed=1))
  assert sorted(other['train']) != sorted(rows['train'])


def test_the_written_files_read_back_with_the_fine_tuning_configs_labels(three_books, tmp_path):
  config = finetune_book_passages.get_config()
  assert config.data.labels == ('pg768', 'pg8374', 'pg2496')
  rows = book_passages.build(three_books, SETTINGS)
  paths = book_passages.write(rows, str(tmp_path / 'task'))
  assert sorted(os.path.basename(p) for p in paths.values()) == sorted(
      name for files in config.data.split_files.values() for name in files
  )
  examples = labelled_examples.read_tsv(
      paths['validation'], ('sentence',), 'label', ('pg1', 'pg2', 'pg3')
  )
  assert [text for (text,) in examples.texts] == [passage for passage, _ in rows['validation']]
  assert list(examples.labels) == [int(label[-1]) - 1 for _, label in rows['validation']]


@pytest.mark.parametrize(
    'change, message',
    [
        (lambda books: books[:1], 'needs two or more'),
        (lambda books: [*books[:2], books[0]], 'share a file name'),
        (lambda books: [*books[:2], '/nonexistent/pg9.txt'], 'is not a file'),
    ],
)
def test_bad_books_are_refused_in_one_line(three_books, change, message):
  with pytest.raises(ConfigError, match=message):
    book_passages.build(change(three_books), SETTINGS)


@pytest.mark.parametrize(
    'settings, message',
    [
        (book_passages.PassageSettings(min_words=50, max_words=40), 'min_words <= max_words'),
        (book_passages.PassageSettings(train_share=0.9, validation_share=0.1), 'test split'),
    ],
)
def test_bad_settings_are_refused_in_one_line(three_books, settings, message):
  with pytest.raises(ConfigError, match=message):
    book_passages.build(three_books, settings)


def test_a_book_too_short_for_a_split_is_named(tmp_path, three_books):
  short = write_book(tmp_path, 'pg4', 3)  # 3 passages: none for validation
  with pytest.raises(ConfigError, match='pg4 has no .* passage; pass longer books'):
    book_passages.build([*three_books, short], SETTINGS)


@pytest.mark.slow
def test_the_command_writes_the_task_and_never_overwrites_it(three_books, tmp_path, run_command):
  out = tmp_path / 'task'
  process = run_command('make_book_passages', f'--books={",".join(three_books)}', f'--out={out}')
  assert process.returncode == 0, process.stderr
  assert 'validation: 135 passages' in process.stdout
  before = {name: (out / name).read_text() for name in os.listdir(out)}
  again = run_command(
      'make_book_passages', f'--books={",".join(three_books)}', f'--out={out}', '--seed=1'
  )
  assert again.returncode == 2
  assert again.stderr.strip().splitlines() == [
      f'error: {out} already holds train.tsv, dev.tsv, test.tsv; remove them or pick another --out.'
  ]
  assert {name: (out / name).read_text() for name in os.listdir(out)} == before
