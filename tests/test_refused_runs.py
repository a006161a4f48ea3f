"""A refused command leaves the file system as it found it (issue 61).

What a run makes before every check that can refuse it has passed (its
workdir and the parent folders that did not exist, a tokenizer trained for a
run whose own tokenizer.model is gone) is removed again when it is refused
(`storage.undone_if_refused`); a reader keeps such a tokenizer only when the
checkpoint was trained with it.
"""

import os
import random
import shutil

import pytest
from run_helpers import folder_contents
from run_helpers import one_error_line
from run_helpers import tiny_config
from run_helpers import tiny_flags

from linformer_jax import run_folder
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_builder
from linformer_jax.training import run_loading
from linformer_jax.training import trainer
from linformer_jax.training import training_run

# What a run refused for another tokenizer says when its own file was gone.
MADE_AGAIN = 'tokenizer.model was missing, and the one made again now is not the tokenizer'


def _refused_config():
  return tiny_config(**{'data.eval_split': 'nosuch'})


def test_a_refused_run_leaves_no_folder_it_made(tmp_path):
  (tmp_path / 'x').mkdir()
  (tmp_path / 'x' / 'notes.txt').write_text('kept')
  before = folder_contents(tmp_path)
  with pytest.raises(ConfigError, match="Split 'nosuch' does not exist"):
    trainer.train_and_evaluate(_refused_config(), str(tmp_path / 'x' / 'a' / 'b' / 'c'))
  assert folder_contents(tmp_path) == before


def test_the_refused_command_leaves_no_parent_folders(tmp_path, run_command):
  before = folder_contents(tmp_path)
  result = run_command(
      'train', *tiny_flags(tmp_path / 'x' / 'a' / 'b' / 'c'), '--config.data.eval_split=nosuch'
  )
  one_error_line(result, "Split 'nosuch' does not exist")
  assert folder_contents(tmp_path) == before


def _pseudo_words(folder, seed):
  """A folder with one text file of random pseudo-words."""
  rng = random.Random(seed)
  folder.mkdir(parents=True)
  syllables = [a + b for a in 'bdfgklmnprstvz' for b in 'aeiou']
  words = lambda: (''.join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(40))
  (folder / 'words.txt').write_text('\n\n'.join(' '.join(words()) for _ in range(60)) + '\n')
  return folder


def _sentencepiece_config(corpus):
  """configs/tiny.py with a 200-piece SentencePiece model of `corpus`."""
  return tiny_config(
      **{
          'data.tokenizer': 'sentencepiece',
          'data.vocab_size': 200,
          'data.source': 'text_files',
          'data.path': str(corpus),
          'data.eval_split': 'train',
          'data.prepare_workers': 1,
      }
  )


@pytest.fixture(scope='module')
def lost_tokenizer(tmp_path_factory):
  """(workdir, its corpus, other text): a SentencePiece run with the
  checkpoint of its step 0 (nothing compiled), whose tokenizer.model was
  deleted."""
  root = tmp_path_factory.mktemp('lost_tokenizer')
  corpus, other = _pseudo_words(root / 'corpus', 0), _pseudo_words(root / 'other', 1)
  workdir = root / 'run'
  run = training_run.TrainingRun(
      run_builder.build_parts(_sentencepiece_config(corpus)), str(workdir)
  )
  run.save(force=True)
  run.store.close()
  os.remove(run_folder.RunFolder(str(workdir)).tokenizer())
  return workdir, corpus, other


@pytest.fixture
def run_without_tokenizer(lost_tokenizer, tmp_path):
  workdir, corpus, other = lost_tokenizer
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  return str(copy), corpus, other


def test_a_run_refused_for_another_text_keeps_no_tokenizer(run_without_tokenizer):
  workdir, corpus, other = run_without_tokenizer
  before = folder_contents(workdir)
  with pytest.raises(ConfigError, match=MADE_AGAIN):
    trainer.train_and_evaluate(_sentencepiece_config(other), workdir)
  assert folder_contents(workdir) == before
  # The original command is not blocked: its text makes its tokenizer again.
  run = training_run.TrainingRun(run_builder.build_parts(_sentencepiece_config(corpus)), workdir)
  run.store.close()
  assert int(run.state.step) == 0
  assert os.path.isfile(run_folder.RunFolder(workdir).tokenizer())


def test_a_reader_refused_for_another_text_keeps_no_tokenizer(run_without_tokenizer):
  workdir, corpus, other = run_without_tokenizer
  before = folder_contents(workdir)
  with pytest.raises(ConfigError, match=MADE_AGAIN):
    run_loading.load_run(_sentencepiece_config(other), workdir, with_data=True)
  assert folder_contents(workdir) == before
  assert run_loading.load_run(_sentencepiece_config(corpus), workdir, with_data=True).step == 0
