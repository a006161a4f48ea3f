"""Classification sources: the registered ones give the batches they gave as
`if` branches, and a source registered from a file of one's own trains the
classification path end to end."""

import hashlib
import math
import os

from conftest import REPO_ROOT
import numpy as np
import pytest
from run_helpers import typed

from linformer_jax import registry
from linformer_jax.data import classification as classification_data
from linformer_jax.data import classification_sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.training import trainer
from tests.test_classification import tiny_classifier_config
from tests.test_classification import write_sentiment_tsv

# Digests of the first training batches and every evaluation batch of the
# configs below, computed from the code before the sources were registered
# (the `if data.source == ...` branches): the same config and seed must keep
# giving bitwise the same batches.
REFERENCE_DIGESTS = {
    'tsv_single': '54ee866f88d4a8f7',
    'tsv_pairs': 'a4c8a4c237c19972',
    'listops': 'f2c56c3d760f9d61',
}
TRAIN_BATCHES = 3
BYTES = tokenizer_lib.ByteTokenizer()

# A classification dataset of one's own, one file as an extension author
# writes it: which of two letters a string of them holds more of, made in
# memory, with a declared setting (config.data.letters_per_example).
# A source of one's own, as docs/extending.md shows it.
EXTENSION = REPO_ROOT / 'docs' / 'examples' / 'more_letters_source.py'


def write_pairs_tsv(folder):
  """A question<TAB>answer<TAB>label file per split, texts of several lengths."""
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(1)
  for split, size in (('train', 40), ('dev', 12)):
    with open(os.path.join(folder, f'{split}.tsv'), 'w') as f:
      f.write('question\tanswer\tlabel\n')
      for _ in range(size):
        words = [' '.join('ab'[int(b)] * 3 for b in rng.integers(0, 2, rng.integers(1, 9)))]
        label = ('yes', 'no', 'maybe')[rng.integers(0, 3)]
        f.write(f'is it {words[0]}?\tit is {label} {words[0][::-1]}\t{label}\n')


def reference_configs(tmp_path):
  write_sentiment_tsv(tmp_path / 'single')
  write_pairs_tsv(tmp_path / 'pairs')
  return {
      'tsv_single': tiny_classifier_config(tmp_path / 'single', seed=3),
      'tsv_pairs': tiny_classifier_config(
          tmp_path / 'pairs',
          **{
              'data.text_columns': ('question', 'answer'),
              'data.labels': ('yes', 'no', 'maybe'),
              'data.truncation': 'head_tail',
              'data.seq_len': 16,
              'data.max_train_examples': 24,
              'data.max_eval_batches': 1,
          },
      ),
      'listops': tiny_classifier_config(
          tmp_path,
          **{
              'data.source': 'listops',
              'data.tokenizer': 'listops',
              'data.vocab_size': 16,
              'data.listops': dict(
                  num_train=32, num_validation=12, num_test=4, min_length=5, max_length=32
              ),
              'data.cache_dir': str(tmp_path / 'cache'),
          },
      ),
  }


def batches_digest(config, workdir):
  """sha256 (16 hex digits) of the first TRAIN_BATCHES training batches, every
  evaluation batch, the sizes and the label counts that build_datasets gives."""
  data = classification_data.build_datasets(typed(config), str(workdir))
  digest = hashlib.sha256()
  batches = [next(data.train_iterator) for _ in range(TRAIN_BATCHES)] + data.eval_batches
  for batch in batches:
    for key in sorted(batch):
      digest.update(f'{key}{batch[key].dtype}{batch[key].shape}'.encode())
      digest.update(np.ascontiguousarray(batch[key]).tobytes())
  digest.update(f'{data.train_sequences} {data.eval_sequences}'.encode())
  digest.update(data.train_label_counts.astype(np.int64).tobytes())
  return digest.hexdigest()[:16]


@pytest.mark.parametrize('name', sorted(REFERENCE_DIGESTS))
def test_the_built_in_sources_give_the_batches_they_gave_before(name, tmp_path):
  config = reference_configs(tmp_path)[name]
  assert batches_digest(config, tmp_path / 'run') == REFERENCE_DIGESTS[name]


def test_the_built_in_sources_are_listed_when_a_name_is_refused(tmp_path):
  config = tiny_classifier_config(tmp_path, **{'data.source': 'glue'})
  with pytest.raises(ConfigError) as raised:
    classification_data.build_datasets(typed(config), str(tmp_path / 'run'))
  message = str(raised.value)
  assert message.startswith(
      "config.data.source='glue' is not allowed for task=classification; use one of "
      "('tsv', 'tfds', 'listops'"
  )
  assert '\n' not in message and 'config.extensions' in message
  with pytest.raises(ConfigError, match="config.data.source='glue' is not allowed"):
    classification_data.num_classes(config)


def test_each_source_says_its_classes_and_vocabulary(tmp_path):
  config = tiny_classifier_config(tmp_path, **{'data.labels': ('a', 'b', 'c')})
  for name, classes, own_vocab_size in (('tsv', 3, None), ('tfds', 3, None), ('listops', 10, 16)):
    config.data.source = name
    source = classification_sources.source_of(typed(config).data)
    assert source.num_classes(config.data) == classification_data.num_classes(config) == classes
    assert source.own_vocab_size == own_vocab_size


@pytest.fixture(scope='module')
def extension():
  import_extensions((str(EXTENSION),))
  return str(EXTENSION)


def extension_config(extension, tmp_path, **overrides):
  config = tiny_classifier_config(
      tmp_path,
      **{
          'extensions': (extension,),
          'data.source': 'more_letters',
          'total_steps': 4,
          'eval_every': 4,
          'checkpoint_every': 4,
          'log_every': 2,
          'model.num_layers': 1,
          **overrides,
      },
  )
  registry.add_declared_settings(config)
  return config


def test_a_source_of_ones_own_is_refused_with_a_bad_setting(extension, tmp_path):
  config = extension_config(extension, tmp_path)
  assert config.data.letters_per_example == 7
  config.data.letters_per_example = 8
  with pytest.raises(
      ConfigError, match=r'config.data.letters_per_example=8 is not allowed; use an odd'
  ):
    classification_data.build_datasets(typed(config), str(tmp_path / 'run'))
  config.data.source = 'glue'
  with pytest.raises(ConfigError, match=r"use one of \('tsv', 'tfds', 'listops', 'more_letters'\)"):
    classification_data.build_datasets(typed(config), str(tmp_path / 'run'))


@pytest.mark.slow
def test_a_source_of_ones_own_trains_the_classification_path(extension, tmp_path):
  config = extension_config(extension, tmp_path, **{'data.letters_per_example': 9})
  data = classification_data.build_datasets(typed(config), str(tmp_path / 'data'))
  assert (data.train_sequences, data.eval_sequences) == (48, 48)
  batch = next(data.train_iterator)
  letters = set(BYTES.encode('a b'))
  for row, real, label in zip(batch['inputs'], batch['padding_mask'], batch['labels']):
    text = row[real]
    assert len(text) == 2 + 17  # <s>, 9 letters and 8 spaces, </s>
    assert (text[0], text[-1]) == (BYTES.bos_id, BYTES.eos_id) and set(text[1:-1]) <= letters
    assert label == int(2 * np.sum(text == BYTES.encode('b')[0]) > 9)
  assert data.train_label_counts.sum() == 48 and data.train_label_counts.shape == (2,)

  results = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert results['step'] == 4 and results['eval_examples'] == 48
  assert math.isfinite(results['eval_loss'])
