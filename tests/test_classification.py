"""Classification: pair encoding, TSV errors, fine-tuning from a pretrained run, ListOps.

The fine-tuned run's reported evaluation is checked against a float64
recomputation from the saved classifier and against the TSV files' labels.
"""

import os
import random

import jax
import numpy as np
import pytest
from run_helpers import typed

from configs import classification
from configs import finetune_qnli
from configs import tiny
from linformer_jax import run_folder
from linformer_jax.data import classification as classification_data
from linformer_jax.data import classification_sources
from linformer_jax.data import encoding
from linformer_jax.data import labelled_examples
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import run_loading
from linformer_jax.training import trainer
from linformer_jax.training import training_run

BYTES = tokenizer_lib.ByteTokenizer()
POSITIVE = ('good', 'great', 'fine', 'lovely', 'superb')
NEGATIVE = ('bad', 'awful', 'poor', 'dull', 'weak')


def write_sentiment_tsv(folder, seed=0, count=96):
  """A learnable toy task: the label says whether a positive word occurs."""
  rng = random.Random(seed)
  os.makedirs(folder, exist_ok=True)
  for split, size in (('train', count), ('dev', 32)):
    with open(os.path.join(folder, f'{split}.tsv'), 'w') as f:
      f.write('sentence\tlabel\n')
      for _ in range(size):
        label = rng.randrange(2)
        word = rng.choice(POSITIVE if label else NEGATIVE)
        f.write(f'the film was {word} indeed\t{label}\n')


def tiny_classifier_config(data_dir, **overrides):
  config = classification.get_config()
  pretrain = tiny.get_config()
  pretrain.model.pooling = config.model.pooling  # the classification default
  config.model = pretrain.model  # the tiny encoder (vocab 260, n = 32, k = 8)
  for field in ('tokenizer', 'vocab_size'):
    config.data[field] = pretrain.data[field]
  config.model.vocab_size = config.data.get_ref('vocab_size')
  config.data.path = str(data_dir)
  config.data.split_files = {'train': ['train.tsv'], 'validation': ['dev.tsv']}
  config.update(
      dict(
          total_steps=30,
          batch_size=8,
          eval_batch_size=8,
          warmup_steps=3,
          learning_rate=3e-3,
          log_every=10,
          eval_every=30,
          checkpoint_every=30,
      )
  )
  config.update_from_flattened_dict(overrides)
  return config


@pytest.fixture(scope='module')
def pretrained(tiny_run):
  return tiny_run[0]


def tsv_labels(folder, split):
  rows = (folder / f'{split}.tsv').read_text().splitlines()[1:]
  return [int(row.split('\t')[-1]) for row in rows]


def majority_class_accuracy(folder):
  """The share of dev.tsv's labels equal to train.tsv's most common one."""
  train = tsv_labels(folder, 'train')
  majority = max(sorted(set(train)), key=train.count)  # a tie: the lowest label
  dev = tsv_labels(folder, 'dev')
  return sum(label == majority for label in dev) / len(dev)


def reference_evaluation(config, workdir):
  """Loss and accuracy of a run's newest classifier on its evaluation split,
  from its logits in float64, with the number of near-ties (whose argmax
  float32 rounding may flip)."""
  run = training_run.TrainingRun(run_builder.build_parts(config), workdir)
  variables = run.state.variables()
  run.store.close()
  model = models.SequenceClassifier(
      ModelConfig.from_config(config.model), classification_data.num_classes(config)
  )
  loss = correct = weight = near_ties = 0.0
  for batch in classification_data.build_datasets(typed(config), workdir, train=False).eval_batches:
    logits = np.asarray(
        model.apply(variables, batch['inputs'], batch['padding_mask'], segments=batch['segments']),
        np.float64,
    )
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    labels, weights = batch['labels'], batch['weights']
    loss -= np.sum(weights * log_probs[np.arange(len(labels)), labels])
    correct += np.sum(weights * (logits.argmax(-1) == labels))
    top_two = np.sort(logits, -1)[:, -2:]
    near_ties += np.sum(weights * (top_two[:, 1] - top_two[:, 0] < 1e-4))
    weight += weights.sum()
  return {
      'loss': loss / weight,
      'accuracy': correct / weight,
      'near_ties': near_ties / weight,
      'examples': weight,
  }


def test_single_texts_and_pairs_get_bos_eos_separators_and_segments():
  ids, segments = encoding.encode_texts(['ab'], BYTES, 16)
  assert ids == [BYTES.bos_id, *BYTES.encode('ab'), BYTES.eos_id]
  assert segments == [0, 0, 0, 0]
  ids, segments = encoding.encode_texts(['ab', 'xyz'], BYTES, 16)
  assert ids == [
      BYTES.bos_id,
      *BYTES.encode('ab'),
      BYTES.eos_id,
      BYTES.eos_id,
      *BYTES.encode('xyz'),
      BYTES.eos_id,
  ]
  assert segments == [0, 0, 0, 0, 1, 1, 1, 1, 1]


def test_long_texts_are_cut_to_fit_as_the_config_says():
  text = 'abcdefghij'
  ids, _ = encoding.encode_texts([text], BYTES, 6, 'head')
  assert BYTES.decode(ids) == 'abcd'
  ids, _ = encoding.encode_texts([text], BYTES, 6, 'head_tail')
  assert BYTES.decode(ids) == 'abij'
  # A pair loses tokens from its longer text first.
  ids, segments = encoding.encode_texts(['abcdefgh', 'xy'], BYTES, 10)
  assert len(ids) == 10 and segments.count(1) == 4  # 'xy' kept whole
  assert BYTES.decode(ids[: segments.index(1)]) == 'abcd'


def test_bad_tsv_files_name_the_file_and_what_to_change(tmp_path):
  path = tmp_path / 'train.tsv'
  path.write_text('text\tlabel\nfine\t1\n')
  with pytest.raises(ConfigError, match=r"train.tsv has no column 'sentence'.*text, label"):
    labelled_examples.read_tsv(path, ['sentence'], 'label', ['0', '1'])
  path.write_text('sentence\tlabel\nfine\t1\nodd\t7\n')
  with pytest.raises(
      ConfigError, match=r"train.tsv:3: label '7' is not in config.data.labels=\('0', '1'\)"
  ):
    labelled_examples.read_tsv(path, ['sentence'], 'label', ['0', '1'])
  path.write_text('sentence\tlabel\nfine\t1\textra\n')
  with pytest.raises(ConfigError, match='train.tsv:2: 3 fields'):
    labelled_examples.read_tsv(path, ['sentence'], 'label', ['0', '1'])


def test_fine_tuning_loads_the_pretrained_encoder_and_trains(pretrained, tmp_path):
  write_sentiment_tsv(tmp_path / 'data')
  config = tiny_classifier_config(tmp_path / 'data', init_from=pretrained)
  pretrained_run = training_run.TrainingRun(run_builder.build_parts(tiny.get_config()), pretrained)
  pretrained_encoder = jax.device_get(pretrained_run.state.params['encoder'])
  pretrained_run.store.close()
  run = training_run.TrainingRun(run_builder.build_parts(config), str(tmp_path / 'start'))
  # Every encoder array equals the pretrained one; the head is new.
  jax.tree_util.tree_map(
      np.testing.assert_array_equal, jax.device_get(run.state.params['encoder']), pretrained_encoder
  )
  assert set(run.state.params) == {'encoder', 'classifier_dense', 'classifier_out'}
  run.store.close()

  workdir = str(tmp_path / 'finetuned')
  results = trainer.train_and_evaluate(config, workdir)
  assert results['task'] == 'classification' and results['step'] == 30
  assert results['eval_examples'] == 32
  expected = reference_evaluation(config, workdir)
  assert expected['examples'] == 32
  assert results['eval_loss'] == pytest.approx(expected['loss'], rel=1e-4)
  assert abs(results['eval_accuracy'] - expected['accuracy']) <= (expected['near_ties'] + 1e-6)
  assert results['majority_class_accuracy'] == pytest.approx(
      majority_class_accuracy(tmp_path / 'data'), abs=1e-9
  )
  assert (
      os.path.exists(tmp_path / 'finetuned' / run_folder.TOKENIZER_FILES['sentencepiece']) is False
  )


@pytest.mark.long
def test_attention_pooling_starts_fresh_on_a_pretrained_encoder_and_is_saved(pretrained, tmp_path):
  """init_from loads the encoder and creates the query at zero; training moves
  it, and evaluation loads the trained query back."""
  write_sentiment_tsv(tmp_path / 'data')
  config = tiny_classifier_config(
      tmp_path / 'data', init_from=pretrained, **{'model.pooling': 'attention', 'total_steps': 10}
  )
  run = training_run.TrainingRun(run_builder.build_parts(config), str(tmp_path / 'start'))
  assert not np.any(jax.device_get(run.state.params['pool_query']))
  run.store.close()
  workdir = str(tmp_path / 'finetuned')
  trainer.train_and_evaluate(config, workdir)
  trained = training_run.TrainingRun(run_builder.build_parts(config), workdir)
  query = jax.device_get(trained.state.params['pool_query'])
  trained.store.close()
  assert np.any(query)
  loaded = run_loading.load_run(config, workdir, with_data=True)
  np.testing.assert_array_equal(jax.device_get(loaded.variables['params']['pool_query']), query)


@pytest.mark.long
def test_a_shorter_seq_len_gives_the_same_logits_for_texts_that_fit(pretrained, tmp_path):
  """data.seq_len below model.max_len cuts only padding: the same ids, the same
  logits; training runs at that length; a seq_len over max_len is refused."""
  write_sentiment_tsv(tmp_path / 'data')  # at most 28 byte tokens with <s> and </s>
  full = tiny_classifier_config(tmp_path / 'data', init_from=pretrained)
  short = tiny_classifier_config(
      tmp_path / 'data', init_from=pretrained, **{'data.seq_len': 28, 'total_steps': 4}
  )
  run = training_run.TrainingRun(run_builder.build_parts(full), str(tmp_path / 'start'))
  variables = run.state.variables()
  run.store.close()
  model = models.SequenceClassifier(ModelConfig.from_config(full.model), 2)

  def batches_and_logits(config):
    data = classification_data.build_datasets(typed(config), str(tmp_path / 'start'), train=False)
    batch = data.eval_batches[0]
    logits = model.apply(
        variables, batch['inputs'], batch['padding_mask'], segments=batch['segments']
    )
    return batch, np.asarray(logits)

  full_batch, full_logits = batches_and_logits(full)
  short_batch, short_logits = batches_and_logits(short)
  assert full_batch['inputs'].shape[1] == 32 and short_batch['inputs'].shape[1] == 28
  np.testing.assert_array_equal(short_batch['inputs'], full_batch['inputs'][:, :28])
  assert not full_batch['padding_mask'][:, 28:].any()
  np.testing.assert_allclose(short_logits, full_logits, rtol=1e-5, atol=1e-6)
  assert trainer.train_and_evaluate(short, str(tmp_path / 'short'))['step'] == 4
  with pytest.raises(ConfigError, match=r'config\.data\.seq_len=33 .*max_len=32'):
    classification_data.build_datasets(
        typed(tiny_classifier_config(tmp_path / 'data', **{'data.seq_len': 33})),
        str(tmp_path / 'bad'),
    )


@pytest.mark.long
def test_runs_fine_tuned_before_mean_pooling_became_the_default_load_unchanged(
    pretrained, tmp_path
):
  """A first-token run (the old default) is refused by today's mean-pooling
  config, naming the field; with model.pooling='first' it loads its own arrays
  and gives the logits it gave before. A run saved before the field existed
  counts as 'first'."""
  assert classification.get_config().model.pooling == 'mean'
  write_sentiment_tsv(tmp_path / 'data')
  old = tiny_classifier_config(
      tmp_path / 'data', init_from=pretrained, **{'model.pooling': 'first', 'total_steps': 4}
  )
  workdir = str(tmp_path / 'old')
  trainer.train_and_evaluate(old, workdir)
  run = training_run.TrainingRun(run_builder.build_parts(old), workdir)
  variables = run.state.variables()
  run.store.close()
  batch = classification_data.build_datasets(typed(old), workdir, train=False).eval_batches[0]
  model = models.SequenceClassifier(ModelConfig.from_config(old.model), 2)
  before = model.apply(
      variables, batch['inputs'], batch['padding_mask'], segments=batch['segments']
  )

  today = tiny_classifier_config(tmp_path / 'data', init_from=pretrained)
  with pytest.raises(
      ConfigError, match="model.pooling='first', not 'mean'.*--config.model.pooling"
  ):
    run_loading.load_run(today, workdir, with_data=True)
  today.model.pooling = 'first'
  loaded = run_loading.load_run(today, workdir, with_data=True)
  after = model.apply(
      loaded.variables, batch['inputs'], batch['padding_mask'], segments=batch['segments']
  )
  np.testing.assert_array_equal(np.asarray(after), np.asarray(before))

  saved_before_the_field = old.to_dict()
  del saved_before_the_field['model']['pooling']
  run_config.check_same_model(saved_before_the_field, typed(today), workdir)  # 'first': accepted
  today.model.pooling = 'mean'
  with pytest.raises(ConfigError, match="model.pooling='first', not 'mean'"):
    run_config.check_same_model(saved_before_the_field, typed(today), workdir)


@pytest.mark.slow
def test_a_short_run_learns_the_toy_task(tmp_path):
  write_sentiment_tsv(tmp_path / 'data', count=256)
  config = tiny_classifier_config(
      tmp_path / 'data', total_steps=120, eval_every=120, checkpoint_every=120
  )
  results = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert results['eval_accuracy'] >= 0.9, results


def test_pairs_add_a_zero_segment_embedding_to_the_pretrained_encoder(pretrained, tmp_path):
  folder = tmp_path / 'pairs'
  folder.mkdir()
  for split in ('train', 'dev'):
    (folder / f'{split}.tsv').write_text(
        'question\tsentence\tlabel\n'
        + ''.join(f'is it {w}?\tit is {w}.\t{i % 2}\n' for i, w in enumerate(POSITIVE + NEGATIVE))
    )
  config = tiny_classifier_config(
      folder,
      init_from=pretrained,
      total_steps=2,
      warmup_steps=1,
      batch_size=2,
      eval_batch_size=4,
      **{'model.num_segments': 2, 'data.text_columns': ('question', 'sentence')},
  )
  run = training_run.TrainingRun(run_builder.build_parts(config), str(tmp_path / 'run'))
  batch = run.data.eval_batches[0]
  first = batch['inputs'][0]
  eos = np.flatnonzero(first == BYTES.eos_id)
  assert len(eos) == 3
  np.testing.assert_array_equal(batch['segments'][0][: eos[0] + 1], 0)
  np.testing.assert_array_equal(batch['segments'][0][eos[1] : eos[2] + 1], 1)
  assert not batch['padding_mask'][0][eos[2] + 1 :].any()
  segment_embedding = np.asarray(run.state.params['encoder']['segment_embedding'])
  assert segment_embedding.shape == (2, 32) and not segment_embedding.any()
  run.store.close()


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'model.hidden_dim': 64, 'model.num_heads': 2}, 'model.hidden_dim=32'),
        ({'model.max_len': 64}, 'model.max_len=32'),
        ({'model.sharing': 'headwise'}, "model.sharing='layerwise'"),
    ],
)
def test_a_pretrained_run_of_another_shape_is_refused_naming_the_field(
    pretrained, tmp_path, overrides, message
):
  write_sentiment_tsv(tmp_path / 'data')
  config = tiny_classifier_config(tmp_path / 'data', init_from=pretrained, **overrides)
  with pytest.raises(ConfigError, match=message):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints')


@pytest.mark.long
def test_a_fine_tuning_config_named_by_a_run_takes_its_encoder(pretrained, tmp_path):
  """configs/finetune_qnli.py:RUN: the pretraining run's model fields and
  tokenizer, the task's pooling, dropout and segments; it fine-tunes as is."""
  config = finetune_qnli.get_config(pretrained)
  saved = tiny.get_config()
  assert config.init_from == pretrained
  for field in ('vocab_size', 'max_len', 'num_layers', 'hidden_dim', 'projected_len'):
    assert config.model[field] == saved.model[field], field
  assert (config.data.tokenizer, config.data.vocab_size) == (
      saved.data.tokenizer,
      saved.data.vocab_size,
  )
  assert (config.model.pooling, config.model.num_segments) == ('mean', 2)
  assert config.model.dropout_rate == classification.get_config().model.dropout_rate
  write_sentiment_tsv(tmp_path / 'data')
  config.data.update(source='tsv', path=str(tmp_path / 'data'), text_columns=('sentence',))
  config.data.labels = ('0', '1')
  config.update(total_steps=2, batch_size=8, eval_batch_size=8, warmup_steps=1, eval_every=2)
  trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  with pytest.raises(ValueError, match='must be a run folder'):
    finetune_qnli.get_config(str(tmp_path / 'none'))


def test_fine_tuning_from_a_folder_without_a_run_is_refused(tmp_path):
  write_sentiment_tsv(tmp_path / 'data')
  config = tiny_classifier_config(tmp_path / 'data', init_from=str(tmp_path / 'none'))
  with pytest.raises(ConfigError, match='holds no checkpoint'):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))


@pytest.mark.long
@pytest.mark.slow
def test_listops_trains_from_scratch_on_generated_trees(tmp_path):
  config = tiny_classifier_config(
      tmp_path,
      **{
          'data.source': 'listops',
          'data.tokenizer': 'listops',
          'data.vocab_size': 16,
          'data.listops': dict(
              num_train=64, num_validation=16, num_test=16, min_length=5, max_length=32
          ),
          'data.cache_dir': str(tmp_path / 'cache'),
          'model.pooling': 'mean',
          'total_steps': 10,
          'eval_every': 10,
          'checkpoint_every': 10,
      },
  )
  results = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert results['eval_examples'] == 16 and results['step'] == 10
  assert os.listdir(tmp_path / 'cache' / 'listops')


def test_mean_pooling_ignores_padding():
  config = ModelConfig(
      vocab_size=20,
      max_len=16,
      num_layers=1,
      num_heads=2,
      hidden_dim=8,
      mlp_dim=16,
      projected_len=4,
      pooling='mean',
  )
  model = models.SequenceClassifier(config, num_classes=3)
  tokens = np.array([[5, 6, 7, 0, 0, 0, 0, 0]], np.int32)
  mask = tokens != 0
  variables = model.init(jax.random.PRNGKey(0), tokens)
  short = model.apply(variables, tokens[:, :3], mask[:, :3])
  padded = model.apply(variables, tokens, mask)
  np.testing.assert_allclose(short, padded, rtol=1e-5, atol=1e-6)


def test_fine_tuning_uses_the_pretrained_runs_sentencepiece_model(tmp_path):
  pretrained = tmp_path / 'pretrained'
  pretrained.mkdir()
  words = ' '.join(POSITIVE + NEGATIVE + ('the', 'film', 'was', 'indeed'))
  model = tokenizer_lib.SentencePieceTokenizer.train(
      iter([words] * 50), 30, str(pretrained / run_folder.TOKENIZER_FILES['sentencepiece'])
  )
  write_sentiment_tsv(tmp_path / 'data')
  config = tiny_classifier_config(
      tmp_path / 'data',
      init_from=str(pretrained),
      **{'data.tokenizer': 'sentencepiece', 'data.vocab_size': 30},
  )
  workdir = tmp_path / 'run'
  datasets = classification_data.build_datasets(typed(config), str(workdir))
  assert datasets.tokenizer.fingerprint == model.fingerprint
  assert (workdir / run_folder.TOKENIZER_FILES['sentencepiece']).read_bytes() == (
      pretrained / run_folder.TOKENIZER_FILES['sentencepiece']
  ).read_bytes()
  config.init_from = str(tmp_path / 'no_tokenizer')
  with pytest.raises(ConfigError, match='has no tokenizer.model'):
    classification_data.build_datasets(typed(config), str(tmp_path / 'other'))


def test_an_unprepared_tfds_dataset_says_how_to_get_it(tmp_path):
  config = tiny_classifier_config(
      tmp_path,
      **{
          'data.source': 'tfds',
          'data.tfds_name': 'glue/sst2',
          'data.tfds_data_dir': str(tmp_path / 'tfds'),
      },
  )
  with pytest.raises(ConfigError, match='config.data.tfds_download'):
    data = typed(config).data
    classification_sources.source_of(data).examples(data, 'train')


def test_a_capped_evaluation_takes_a_fixed_random_subset_not_the_first_rows():
  labels = np.repeat(np.arange(2, dtype=np.int32), 64)  # sorted by class, as IMDB
  inputs = np.ones([128, 4], np.int32)
  split = classification_data.EncodedSplit(inputs, np.zeros_like(inputs), labels, 0)
  batches = classification_data.create_eval_batches(split, batch_size=8, max_batches=2)
  assert len(batches) == 2
  chosen = np.concatenate([batch['labels'] for batch in batches])
  assert set(chosen) == {0, 1}
  again = classification_data.create_eval_batches(split, batch_size=8, max_batches=2)
  np.testing.assert_array_equal(chosen, np.concatenate([b['labels'] for b in again]))
  everything = classification_data.create_eval_batches(split, batch_size=8)
  assert sum(float(b['weights'].sum()) for b in everything) == 128
