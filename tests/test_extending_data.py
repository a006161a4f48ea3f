"""A data source and a task of one's own, each one file named in
config.extensions (docs/examples/): registered, they train a tiny model like
the package's own; an unknown name is refused with the registered ones."""

import json
import math

import numpy as np
import pytest

from linformer_jax.data import corpus
from linformer_jax.data import masked_lm
from linformer_jax.data import sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.training import run_config
from linformer_jax.training import tasks
from linformer_jax.training import trainer
from tests.run_helpers import data_config
from tests.run_helpers import tiny_config
from tests.run_helpers import typed

JSONL_SOURCE = 'docs/examples/jsonl_source.py'
SHUFFLED_TEXT_TASK = 'docs/examples/shuffled_text_task.py'
BYTES = tokenizer_lib.ByteTokenizer()
# Only these letters are in the JSON-lines corpus; no other source here has
# documents made of them alone.
ALPHABET = 'qxz '


@pytest.fixture(scope='module')
def extensions(repo_root):
  paths = tuple(str(repo_root / path) for path in (JSONL_SOURCE, SHUFFLED_TEXT_TASK))
  import_extensions(paths)
  return paths


def write_jsonl_corpus(folder):
  """train.jsonl and validation.jsonl of words over ALPHABET, a blank line and
  an empty text among the records (both skipped)."""
  folder.mkdir()
  rng = np.random.default_rng(0)
  for split, count in (('train', 120), ('validation', 16)):
    records = [
        {'text': ' '.join(''.join(rng.choice(list('qxz'), 5)) for _ in range(12))}
        for _ in range(count)
    ]
    lines = [json.dumps(record) for record in records] + ['', json.dumps({'text': ''})]
    (folder / f'{split}.jsonl').write_text('\n'.join(lines) + '\n')
  return folder


def quick_config(extensions, tmp_path, **overrides):
  """configs/tiny.py on the JSON-lines corpus, for a few steps."""
  return tiny_config(
      **{
          'extensions': extensions,
          'data.source': 'jsonl',
          'data.path': str(write_jsonl_corpus(tmp_path / 'corpus')),
          'data.prepare_workers': 1,
          'data.max_eval_batches': 1,
          'total_steps': 4,
          'warmup_steps': 1,
          'log_every': 2,
          'eval_every': 4,
          'checkpoint_every': 4,
          'model.num_layers': 1,
          **overrides,
      }
  )


@pytest.mark.long
@pytest.mark.slow
def test_the_example_task_trains_on_the_example_source(extensions, tmp_path):
  """One tiny run uses both files: config.task='shuffled_text' on
  config.data.source='jsonl' (one run, not two, keeps the test fast)."""
  config = quick_config(extensions, tmp_path, task='shuffled_text')
  results = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert results['task'] == 'shuffled_text' and results['step'] == 4
  assert math.isfinite(results['eval_loss'])
  assert 0.0 <= results['kept_accuracy'] <= 1.0

  settings = run_config.RunConfig.from_config(config)
  task = tasks.task_of(settings)
  data = task.build_data(
      settings, str(tmp_path / 'run'), process_index=0, process_count=1, train=True
  )
  batches = [next(data.train_iterator) for _ in range(4)]
  assert all(set(batch) == set(task.batch_shapes(settings)) for batch in batches)
  assert {int(label) for batch in batches for label in batch['labels']} == {0, 1}
  for batch in batches:
    for row, real in zip(batch['inputs'], batch['padding_mask']):
      text = row[real]
      # bos first, eos last, and between them only the records' bytes (and
      # the eos between records): the rows came from the JSON-lines files.
      assert (text[0], text[-1]) == (BYTES.bos_id, BYTES.eos_id)
      assert set(text[1:-1]) <= set(BYTES.encode(ALPHABET)) | {BYTES.eos_id}


def test_the_jsonl_source_feeds_masked_lm_pretraining(extensions, tmp_path):
  config = quick_config(extensions, tmp_path)
  documents = corpus.load_documents(typed(config).data, 'validation')
  assert len(documents) == 16 and set(''.join(documents)) <= set(ALPHABET)
  data = masked_lm.build_datasets(typed(config), str(tmp_path / 'run'), train=False)
  text_ids = set(BYTES.encode(ALPHABET))
  assert set(np.flatnonzero(data.train_token_counts)) == text_ids | {BYTES.bos_id, BYTES.eos_id}
  assert data.train_sequences > 0 and data.eval_batches


def test_an_unknown_source_or_task_is_refused_listing_the_registered_ones(extensions):
  del extensions
  with pytest.raises(ConfigError) as raised:
    corpus.load_documents(data_config(source='jsonlines'), 'train')
  message = str(raised.value)
  assert "config.data.source='jsonlines' is not allowed" in message
  for name in ('embedded', 'text_files', 'tfds', 'jsonl'):
    assert repr(name) in message
  assert 'config.extensions' in message
  assert sources.REGISTRY.names()[:3] == ('embedded', 'text_files', 'tfds')

  with pytest.raises(ConfigError, match=r"config.task='shuffle'.*'shuffled_text'"):
    tasks.task_of(tiny_config(task='shuffle'))
