"""Corpora and tokenizers: the embedded corpus, text files and TFDS, the cache
folder, byte and SentencePiece tokenizers."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
from run_helpers import data_config

from linformer_jax.data import cache
from linformer_jax.data import corpus
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.data.sources import embedded
from linformer_jax.data.sources import text_files
from linformer_jax.data.sources import tfds

BYTES = tokenizer_lib.ByteTokenizer()


# Tokenizers.


def test_byte_tokenizer_round_trips_text():
  text = 'Linformer: O(n) attention — naïve café, 東京 🙂\n'
  ids = BYTES.encode(text)
  assert len(ids) == len(text.encode('utf-8'))
  assert min(ids) >= 4 and max(ids) < BYTES.vocab_size == 260
  assert BYTES.decode([BYTES.bos_id] + ids + [BYTES.eos_id, BYTES.pad_id]) == text


def sentencepiece_documents():
  import pydoc_data.topics  # pylint: disable=g-import-not-at-top

  return [text for _, text in sorted(pydoc_data.topics.topics.items())][:20]


def test_sentencepiece_trains_then_is_reused(tmp_path):
  config = data_config(tokenizer='sentencepiece', vocab_size=300)
  tokenizer = tokenizer_files.build_tokenizer(config, str(tmp_path), sentencepiece_documents)
  assert (tmp_path / 'tokenizer.model').exists()
  assert tokenizer.vocab_size == 300
  assert (
      tokenizer.pad_id,
      tokenizer.unk_id,
      tokenizer.bos_id,
      tokenizer.eos_id,
      tokenizer.mask_id,
  ) == (0, 1, 2, 3, 4)
  text = 'The attribute reference is evaluated.'
  assert tokenizer.decode(tokenizer.encode(text)) == text

  def must_not_train():
    raise AssertionError('the saved tokenizer should have been reused')

  reused = tokenizer_files.build_tokenizer(config, str(tmp_path), must_not_train)
  assert reused.encode(text) == tokenizer.encode(text)
  assert reused.fingerprint == tokenizer.fingerprint
  with pytest.raises(ValueError, match='config.data.vocab_size'):
    tokenizer_files.build_tokenizer(
        data_config(tokenizer='sentencepiece', vocab_size=400), str(tmp_path), must_not_train
    )


def test_bad_tokenizer_settings_raise(tmp_path):
  with pytest.raises(ValueError, match='config.data.tokenizer'):
    tokenizer_files.build_tokenizer(
        data_config(tokenizer='wordpiece', vocab_size=100), str(tmp_path), list
    )
  with pytest.raises(ValueError, match='config.data.vocab_size'):
    tokenizer_files.build_tokenizer(
        data_config(tokenizer='sentencepiece', vocab_size=10**6),
        str(tmp_path),
        sentencepiece_documents,
    )


# Corpora.


def test_embedded_corpus_is_deterministic_and_splits_are_disjoint(tmp_path):
  train = embedded.embedded_documents('train', str(tmp_path))
  validation = embedded.embedded_documents('validation', str(tmp_path))
  version = '.'.join(map(str, sys.version_info[:3]))
  cache_file = tmp_path / f'embedded_docs_py{version}.json'
  titles = [title for title, _ in json.loads(cache_file.read_text())]
  assert len(titles) == len(set(titles))
  assert len(train) > 200 and len(validation) > 5
  assert 0.02 < len(validation) / (len(train) + len(validation)) < 0.1
  assert not set(train) & set(validation)
  assert min(map(len, train + validation)) >= embedded.MIN_DOCUMENT_CHARS
  assert any('attribute reference' in doc for doc in train + validation)
  # A fresh extraction gives the same documents in the same order.
  assert embedded.embedded_documents('train', str(tmp_path / 'again')) == train
  with pytest.raises(ValueError, match='config.data.train_split'):
    embedded.embedded_documents('test', str(tmp_path))


def test_a_ctrl_c_while_a_module_is_read_for_the_corpus_stops_the_command(monkeypatch):
  """A module that fails to import is skipped; Ctrl-C or SIGTERM
  (interrupts.Interrupted, a KeyboardInterrupt) is not a failed import."""

  def interrupted(name):
    raise KeyboardInterrupt(name)

  monkeypatch.setattr(importlib, 'import_module', interrupted)
  with pytest.raises(KeyboardInterrupt):
    embedded._import_quietly('json')  # pylint: disable=protected-access

  def refused(name):
    raise SystemExit(f'{name} does not load here')

  monkeypatch.setattr(importlib, 'import_module', refused)
  assert embedded._import_quietly('json') is None  # pylint: disable=protected-access


def test_the_cache_folder_is_the_config_value_else_the_variable_else_home(monkeypatch, tmp_path):
  monkeypatch.setenv('LINFORMER_JAX_CACHE_DIR', str(tmp_path / 'variable'))
  assert cache.cache_root(str(tmp_path / 'config')) == tmp_path / 'config'
  assert cache.cache_root('') == tmp_path / 'variable'
  monkeypatch.delenv('LINFORMER_JAX_CACHE_DIR')
  assert cache.cache_root('') == pathlib.Path.home() / '.cache' / 'linformer_jax'


def test_the_suite_uses_its_own_cache_not_the_users(data_cache):
  assert cache.cache_root('') == data_cache
  assert cache.cache_root('') != pathlib.Path.home() / '.cache' / 'linformer_jax'


def test_gutenberg_boilerplate_is_stripped():
  body = 'CHAPTER I\n\nIt was a dark night.\n\nTHE END'
  modern = (
      'The Project Gutenberg EBook of Night, by A. Writer\n\nLicence...\n'
      '*** START OF THIS PROJECT GUTENBERG EBOOK NIGHT ***\n'
      f'{body}\n\nEnd of the Project Gutenberg EBook of Night\n\n'
      '*** END OF THIS PROJECT GUTENBERG EBOOK NIGHT ***\nMore licence.\n'
      '*** START: FULL LICENSE ***\nTHE FULL PROJECT GUTENBERG LICENSE\n'
  )
  assert text_files.strip_gutenberg_boilerplate(modern).strip() == body
  old = (
      'Project Gutenberg Etext of Night\n*** START OF THE PROJECT GUTENBERG '
      'EBOOK NIGHT ***\nsmall print ...\n'
      '*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n'
      f"{body}\n\nEnd of Project Gutenberg's Night, by A. Writer\n"
  )
  assert text_files.strip_gutenberg_boilerplate(old).strip() == body
  plain = 'No markers here.\n\nEnd of story; the end of Project X.\n'
  assert text_files.strip_gutenberg_boilerplate(plain) == plain


def test_text_files_split_by_whole_files(tmp_path, books):
  folder = books
  split_files = {'validation': ['b.txt']}
  train = text_files.text_file_documents(str(folder), 'train', split_files)
  validation = text_files.text_file_documents(str(folder), 'validation', split_files)
  assert all('Book b ' not in doc for doc in train)
  assert all('Book b ' in doc and 'Book a ' not in doc for doc in validation)
  assert any('Book a ' in doc for doc in train) and any('Book c ' in doc for doc in train)
  # Boilerplate and hard line wraps are gone; documents are ~4000 characters.
  assert not any('Header' in doc or 'Licence' in doc for doc in train + validation)
  assert all('word\nword' not in doc and '\r' not in doc for doc in train)
  sizes = [len(doc) for doc in validation]
  assert len(validation) > 3 and all(3500 < size < 5000 for size in sizes[:-1])
  paragraphs = '\n'.join(validation).split('\n')
  assert len(paragraphs) == 80 and paragraphs[0].startswith('Book b paragraph 0 ')


def test_text_file_errors_name_the_field(tmp_path, books):
  folder = books
  with pytest.raises(ValueError, match='config.data.path'):
    text_files.text_file_documents(str(tmp_path / 'missing'), 'train', {})
  with pytest.raises(ValueError, match='config.data.split_files'):
    text_files.text_file_documents(str(folder), 'train', {'validation': ['z.txt']})
  with pytest.raises(ValueError, match='config.data.split_files'):
    text_files.text_file_documents(str(folder), 'validation', {})
  (tmp_path / 'empty.txt').write_text('\n\n')
  with pytest.raises(ValueError, match='config.data.path'):
    text_files.text_file_documents(str(tmp_path / 'empty.txt'), 'train', {})


def test_unknown_source_and_missing_tfds_dataset_raise(tmp_path):
  with pytest.raises(ValueError, match='config.data.source'):
    corpus.load_documents(data_config(source='web'), 'train')
  with pytest.raises(ValueError, match='config.data.tfds_download'):
    list(tfds.iter_tfds_documents('lm1b', 'train', data_dir=str(tmp_path)))


@pytest.mark.slow
def test_extracting_the_embedded_corpus_never_runs_code_from_the_current_folder(tmp_path):
  """A `tabnanny.py` where the command runs is not imported in place of the
  standard module while the embedded corpus is extracted."""
  folder = tmp_path / 'here'
  folder.mkdir()
  marker = tmp_path / 'planted_module_ran'
  (folder / 'tabnanny.py').write_text(f'open({str(marker)!r}, "w").close()\n')
  script = folder / 'extract.py'
  script.write_text(
      'import sys\n'
      'from linformer_jax.data.sources import embedded\n'
      'print(len(embedded.embedded_documents("train", sys.argv[1])))\n'
  )
  result = subprocess.run(
      [sys.executable, str(script), str(tmp_path / 'cache')],
      cwd=folder,
      env={**os.environ, 'PYTHONPATH': str(pathlib.Path(__file__).resolve().parents[1])},
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert result.returncode == 0, result.stderr
  assert int(result.stdout.split()[-1]) > 100
  assert not marker.exists()
