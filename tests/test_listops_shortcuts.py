"""listops_shortcuts: the rules and a run's report checked on trees and logits
whose answers are known, and read from a real tiny ListOps run."""

import json
import math

import numpy as np
import pytest

from configs import lra_listops
from linformer_jax import api
from linformer_jax import listops_shortcuts as shortcuts
from linformer_jax.errors import ConfigError
from linformer_jax.training import trainer

# Trees whose outermost operators and values are known (evaluated by hand).
SOURCES = [
    '[MAX 2 [MIN 4 7 ] 0 ]',  # 4: its root digits give 2, a lower bound
    '[MAX 9 1 ]',  # 9
    '[MAX 3 8 ]',  # 8
    '[MIN 6 [MAX 1 5 ] ]',  # 5: its root digits give 6, an upper bound
    '[MIN 0 3 ]',  # 0
    '[SM 4 7 ]',  # 1
]
LABELS = np.array([4, 9, 8, 5, 0, 1])


def test_the_outer_operator_and_the_roots_own_digits_are_read_from_the_prefix_form():
  assert [shortcuts.outer_operator(s) for s in SOURCES] == ['MAX'] * 3 + ['MIN'] * 2 + ['SM']
  assert shortcuts.outer_operator('7') == 'digit'
  assert shortcuts.root_digits('[MAX 2 [MIN 4 7 ] 0 ]') == [2, 0]
  assert shortcuts.root_digits('[SM [MED 1 2 3 ] [MIN 9 ] ]') == []
  assert shortcuts.root_digits('[MED 5 [MAX [SM 1 1 ] 3 ] 8 ]') == [5, 8]


def test_the_rules_are_each_operators_commonest_value_and_the_roots_digit_bounds():
  rules = shortcuts.ShortcutRules.fit(SOURCES, LABELS)
  np.testing.assert_allclose(rules.by_operator['MAX'][[4, 8, 9]], [1 / 3] * 3)
  assert rules.by_operator['MIN'][0] == rules.by_operator['MIN'][5] == 0.5
  assert rules.majority == 0  # six values once each: the smallest of the tied
  assert rules.outer_operator_guess('[SM 1 1 ]') == 1
  # An operator the training trees never had at the root: the overall values.
  overall = np.bincount(LABELS, minlength=10) / 6
  np.testing.assert_allclose(rules.operator_distribution('MED'), overall)
  assert [rules.root_digits_guess(s) for s in SOURCES] == [2, 9, 8, 6, 0, 1]
  assert rules.root_digits_guess('[MAX [SM 1 1 ] [MIN 3 4 ] ]') == 4  # no digits: the MAX rule


def test_each_baseline_scores_as_counted_by_hand():
  rules = shortcuts.ShortcutRules.fit(SOURCES, LABELS)
  found = shortcuts.baselines(rules, SOURCES, LABELS)
  assert found['majority']['accuracy'] == pytest.approx(1 / 6)
  assert found['majority']['loss'] == pytest.approx(math.log(6))
  # MAX guesses 4 (right once in three), MIN 0 (once in two), SM 1 (right).
  assert found['outer_operator']['class_by_operator'] == {'MAX': 4, 'MIN': 0, 'SM': 1}
  assert found['outer_operator']['accuracy'] == pytest.approx(3 / 6)
  assert found['outer_operator']['loss'] == pytest.approx((3 * math.log(3) + 2 * math.log(2)) / 6)
  assert found['root_digits']['accuracy'] == pytest.approx(4 / 6)  # misses both bounds


def naive_loss(logits, labels):
  logits = np.asarray(logits, np.float64)
  return -np.mean(
      [row[label] - math.log(sum(math.exp(v) for v in row)) for row, label in zip(logits, labels)]
  )


def test_a_model_that_reads_the_first_token_alone_follows_its_operator_everywhere():
  rules = shortcuts.ShortcutRules.fit(SOURCES, LABELS)
  rng = np.random.default_rng(0)
  by_operator = {'MAX': 9, 'MIN': 0, 'SM': 3}
  logits = rng.normal(size=(6, 10))
  for row, source in enumerate(SOURCES):
    logits[row, by_operator[shortcuts.outer_operator(source)]] += 20
  report = shortcuts.prediction_report(rules, SOURCES, LABELS, logits)
  assert report['follows_outer_operator'] == 1
  assert report['accuracy'] == pytest.approx(2 / 6)  # [MAX 9 1 ] and [MIN 0 3 ]
  assert report['agrees_with_outer_operator_rule'] == pytest.approx(2 / 6)  # the MIN trees
  assert report['loss'] == pytest.approx(naive_loss(logits, LABELS))
  assert report['per_operator']['MAX'] == {
      'trees': 3,
      'accuracy': pytest.approx(1 / 3),
      'rule_accuracy': pytest.approx(1 / 3),
      'predicted': [[9, 1.0]],
  }


def test_a_model_that_reads_the_whole_tree_follows_no_operator():
  rules = shortcuts.ShortcutRules.fit(SOURCES, LABELS)
  logits = np.eye(10)[LABELS] * 30  # every value right
  report = shortcuts.prediction_report(rules, SOURCES, LABELS, logits)
  assert report['accuracy'] == 1 and report['loss'] == pytest.approx(naive_loss(logits, LABELS))
  assert report['follows_outer_operator'] == pytest.approx(3 / 6)  # one tree per operator
  assert report['per_operator']['MAX']['predicted'] == [[4, 1 / 3], [9, 1 / 3], [8, 1 / 3]]


@pytest.fixture(scope='module')
def listops_run(tmp_path_factory):
  """A ListOps classifier trained for 4 steps on 48 generated trees."""
  root = tmp_path_factory.mktemp('listops_run')
  config = lra_listops.get_config()
  config.data.listops.update(
      num_train=48, num_validation=24, num_test=8, min_length=5, max_length=32
  )
  config.data.cache_dir = str(root / 'cache')
  config.model.update(
      max_len=32, projected_len=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32
  )
  config.update(
      total_steps=4,
      warmup_steps=1,
      batch_size=8,
      eval_batch_size=8,
      eval_every=4,
      checkpoint_every=4,
      log_every=4,
  )
  workdir = str(root / 'run')
  trainer.train_and_evaluate(config, workdir)
  return workdir


@pytest.mark.slow
def test_the_command_scores_every_tree_as_evaluation_does(listops_run, run_command):
  result = run_command('listops_shortcuts', f'--workdir={listops_run}')
  assert result.returncode == 0, result.stderr
  assert 'follows its outer operator in' in result.stdout
  with open(f'{listops_run}/listops_shortcuts_validation.json') as f:
    report = json.load(f)
  # 24 trees in one batch of 100: the filler rows are dropped, none scored twice.
  assert report['trees'] == 24 and report['step'] == 4
  assert sum(found['trees'] for found in report['run']['per_operator'].values()) == 24
  evaluated = api.load(listops_run, with_data=True).evaluate()
  assert report['run']['accuracy'] == pytest.approx(evaluated['eval_accuracy'])
  assert report['run']['loss'] == pytest.approx(evaluated['eval_loss'], rel=1e-5)


@pytest.mark.slow
def test_a_run_on_other_data_or_another_split_is_refused(listops_run, tiny_run):
  with pytest.raises(ConfigError, match='reads a classifier trained on config.data.source='):
    shortcuts.shortcut_report(None, tiny_run[0])
  with pytest.raises(ConfigError, match="--split='dev' is not a ListOps split; use one of"):
    shortcuts.shortcut_report(None, listops_run, split='dev')
