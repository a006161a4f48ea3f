"""A run's SentencePiece model belongs to that run's data and checkpoints.

A run refused for its data leaves no tokenizer.model behind (a later run in
the workdir would reuse it, maybe on other data); a TSV that is not UTF-8 is
one error naming its line; a checkpoint refuses to resume with another run's
tokenizer.model in its workdir, naming the file.
"""

import os
import pathlib
import random
import re
import shutil

import pytest
from run_helpers import typed

from configs import classification
from configs import tiny
from linformer_jax import run_folder
from linformer_jax.data import classification as classification_data
from linformer_jax.data import masked_lm
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_builder
from linformer_jax.training import run_loading
from linformer_jax.training import trainer
from linformer_jax.training import training_run

WORDS = (
    'the film was good bad great awful fine poor lovely dull superb weak plot actors music '
    'scenes story ending camera light slow quick warm cold'
).split()


def write_tsv_data(folder):
  """train.tsv and dev.tsv of short sentences labelled 0/1 (16 dev rows)."""
  rng = random.Random(0)
  folder.mkdir(parents=True, exist_ok=True)
  for split, size in (('train', 64), ('dev', 16)):
    rows = [f'{" ".join(rng.choices(WORDS, k=6))}\t{rng.randrange(2)}\n' for _ in range(size)]
    (folder / f'{split}.tsv').write_text('sentence\tlabel\n' + ''.join(rows))
  return folder


def sentencepiece_classifier_config(data_dir, **overrides):
  """configs/tiny.py's model classifying the TSV data, with a SentencePiece model."""
  config = classification.get_config()
  config.model = tiny.get_config().model
  config.data.tokenizer = 'sentencepiece'
  config.data.vocab_size = 40
  config.model.vocab_size = config.data.get_ref('vocab_size')
  config.data.path = str(data_dir)
  config.data.split_files = {'train': ['train.tsv'], 'validation': ['dev.tsv']}
  config.update(dict(total_steps=2, batch_size=8, eval_batch_size=8, warmup_steps=1))
  config.update_from_flattened_dict(overrides)
  return config


# Ways to break dev.tsv after train.tsv is good, each with the error they cause.
def add_a_bad_label(folder):
  with open(folder / 'dev.tsv', 'a') as f:
    f.write('a review with an odd label\t7\n')
  return "dev.tsv:18: label '7' is not in config.data.labels=('0', '1')"


def remove_the_file(folder):
  (folder / 'dev.tsv').unlink()
  return 'dev.tsv does not exist; set config.data.path'


def add_a_latin1_byte(folder):
  lines = (folder / 'dev.tsv').read_bytes().split(b'\n')
  lines[4] = lines[4].replace(b' ', b' caf\xe9 ', 1)
  (folder / 'dev.tsv').write_bytes(b'\n'.join(lines))
  return 'dev.tsv:5: byte 0xe9 is not UTF-8 text (invalid continuation byte)'


BREAKAGES = [add_a_bad_label, remove_the_file, add_a_latin1_byte]


@pytest.mark.parametrize('breakage', BREAKAGES)
def test_a_classification_run_refused_for_its_data_leaves_no_workdir(tmp_path, breakage):
  message = breakage(write_tsv_data(tmp_path / 'data'))
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=re.escape(message)):
    trainer.train_and_evaluate(sentencepiece_classifier_config(tmp_path / 'data'), str(workdir))
  assert not workdir.exists()


def test_a_refused_fine_tuning_run_keeps_no_copy_of_the_pretrained_tokenizer(tmp_path):
  pretrained = tmp_path / 'pretrained'
  model = tokenizer_lib.SentencePieceTokenizer.train(
      iter([' '.join(WORDS)] * 50), 40, run_folder.RunFolder(str(pretrained)).tokenizer()
  )
  add_a_bad_label(write_tsv_data(tmp_path / 'data'))
  config = sentencepiece_classifier_config(tmp_path / 'data', init_from=str(pretrained))
  workdir = tmp_path / 'run'
  workdir.mkdir()
  with pytest.raises(ConfigError, match='is not in config.data.labels'):
    classification_data.build_datasets(typed(config), str(workdir))
  assert not os.listdir(workdir)
  write_tsv_data(tmp_path / 'data')
  assert (
      classification_data.build_datasets(typed(config), str(workdir)).tokenizer_sha256
      == model.sha256
  )
  assert os.listdir(workdir) == [run_folder.TOKENIZER_FILES['sentencepiece']]


@pytest.mark.slow
@pytest.mark.parametrize('breakage', BREAKAGES)
def test_the_command_refused_for_its_data_says_so_in_one_line_and_leaves_nothing(
    tmp_path, run_command, breakage
):
  message = breakage(write_tsv_data(tmp_path / 'data'))
  workdir = tmp_path / 'run'
  result = run_command(
      'train',
      '--config=configs/finetune_sst2.py',
      f'--workdir={workdir}',
      f'--config.data.path={tmp_path / "data"}',
      '--config.data.vocab_size=40',
  )
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and message in errors[0], result.stderr
  assert 'Traceback' not in result.stderr
  assert not workdir.exists()


def write_pseudo_words(folder, seed):
  """A folder with one text file of random pseudo-words."""
  rng = random.Random(seed)
  folder.mkdir(parents=True, exist_ok=True)
  syllables = [a + b for a in 'bdfgklmnprstvz' for b in 'aeiou']
  words = lambda: (''.join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(40))
  (folder / 'words.txt').write_text('\n\n'.join(' '.join(words()) for _ in range(60)) + '\n')
  return folder


def masked_lm_fields(corpus):
  """configs/tiny.py's overrides for a 200-piece SentencePiece model of `corpus`
  that checkpoints at step 2 (flags as for `python -m linformer_jax.train`)."""
  return {
      'data.tokenizer': 'sentencepiece',
      'data.vocab_size': 200,
      'data.source': 'text_files',
      'data.path': str(corpus),
      'data.eval_split': 'train',
      'data.prepare_workers': 1,
      'total_steps': 4,
      'checkpoint_every': 2,
      'eval_every': 4,
      'log_every': 2,
      'warmup_steps': 1,
  }


def masked_lm_config(corpus, **overrides):
  config = tiny.get_config()
  config.update_from_flattened_dict({**masked_lm_fields(corpus), **overrides})
  return config


def test_a_masked_lm_run_refused_after_preparing_its_data_leaves_no_workdir(tmp_path):
  corpus = write_pseudo_words(tmp_path / 'corpus', seed=0)
  config = masked_lm_config(corpus, **{'data.worker_count': -1})
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match='config.data.worker_count=-1'):
    trainer.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_a_missing_eval_split_is_refused_before_a_tokenizer_is_trained(tmp_path, monkeypatch):
  corpus = write_pseudo_words(tmp_path / 'corpus', seed=0)
  config = masked_lm_config(corpus, **{'data.eval_split': 'test'})

  def must_not_train(*args):
    raise AssertionError('a tokenizer was trained for a run with no eval split')

  monkeypatch.setattr(tokenizer_lib.SentencePieceTokenizer, 'train', must_not_train)
  with pytest.raises(ConfigError, match="Split 'test' is not in config.data.split_files"):
    masked_lm.build_datasets(typed(config), str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory):
  """(corpus, workdir, other_model): a SentencePiece masked-LM run stopped at
  its step 2 checkpoint, and a tokenizer.model of its size from other text."""
  root = tmp_path_factory.mktemp('tokenizers')
  corpus = write_pseudo_words(root / 'corpus', seed=0)
  workdir = root / 'run'
  assert trainer.train_and_evaluate(masked_lm_config(corpus), str(workdir), stop_after=2) is None
  other = masked_lm_config(write_pseudo_words(root / 'other_corpus', seed=1))
  masked_lm.prepare_splits(typed(other), str(root / 'other_run'), tokenizer_only=True)
  return corpus, workdir, pathlib.Path(run_folder.RunFolder(str(root / 'other_run')).tokenizer())


def with_other_tokenizer(stopped_run, tmp_path):
  """A copy of the stopped run's workdir holding the other tokenizer.model."""
  _, workdir, other_model = stopped_run
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  tokenizer_file = pathlib.Path(run_folder.RunFolder(str(copy)).tokenizer())
  assert tokenizer_file.read_bytes() != other_model.read_bytes()
  shutil.copyfile(other_model, tokenizer_file)
  return copy


def test_a_checkpoint_refuses_another_tokenizer_until_its_own_is_back(stopped_run, tmp_path):
  corpus, original, _ = stopped_run
  workdir = with_other_tokenizer(stopped_run, tmp_path)
  with pytest.raises(
      ConfigError,
      match=f'{workdir}/tokenizer.model is not the tokenizer the checkpoint in {workdir} was '
      'trained with .*put the original file back, or use another --workdir',
  ):
    training_run.TrainingRun(run_builder.build_parts(masked_lm_config(corpus)), str(workdir))
  shutil.copyfile(
      run_folder.RunFolder(str(original)).tokenizer(),
      run_folder.RunFolder(str(workdir)).tokenizer(),
  )
  run = training_run.TrainingRun(run_builder.build_parts(masked_lm_config(corpus)), str(workdir))
  run.store.close()
  assert int(run.state.step) == 2


def test_evaluation_refuses_another_tokenizer(stopped_run, tmp_path):
  corpus = stopped_run[0]
  workdir = with_other_tokenizer(stopped_run, tmp_path)
  with pytest.raises(ConfigError, match=f'{workdir}/tokenizer.model is not the tokenizer'):
    run_loading.load_run(masked_lm_config(corpus), str(workdir), with_data=True)


@pytest.mark.slow
def test_the_command_refuses_another_tokenizer_in_one_line(stopped_run, tmp_path, run_command):
  corpus = stopped_run[0]
  workdir = with_other_tokenizer(stopped_run, tmp_path)
  result = run_command(
      'train',
      '--config=configs/tiny.py',
      f'--workdir={workdir}',
      *(f'--config.{field}={value}' for field, value in masked_lm_fields(corpus).items()),
  )
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'Traceback' not in result.stderr, result.stderr
  assert f'{workdir}/tokenizer.model is not the tokenizer the checkpoint' in errors[0]


class _Data:
  tokenizer_sha256 = 'a' * 64


def test_checkpoints_without_a_fingerprint_resume_as_before():
  run_builder.check_same_tokenizer({'process_states': []}, _Data(), 'run')
  run_builder.check_same_tokenizer({'tokenizer_sha256': 'a' * 64}, _Data(), 'run')
  with pytest.raises(ConfigError, match='run/tokenizer.model is not the tokenizer'):
    run_builder.check_same_tokenizer({'tokenizer_sha256': 'b' * 64}, _Data(), 'run')
  with pytest.raises(ConfigError, match='trained without run/tokenizer.model'):
    run_builder.check_same_tokenizer({'tokenizer_sha256': None}, _Data(), 'run')
