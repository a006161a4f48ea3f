"""The training loop's periodic actions (training/loop_actions.py): a
researcher's own action runs where it is due, sees the step's state and
metrics, and can end the loop; the built-in ones are due where they were."""

import importlib.util

from conftest import REPO_ROOT
import jax
import numpy as np
import optax
import pytest
from run_helpers import final_params
from run_helpers import losses_by_step
from run_helpers import tiny_config

from linformer_jax.training import loop_actions
from linformer_jax.training import trainer
from linformer_jax.training.metric_writers import read_metrics


class RecordEveryTwo(loop_actions.PeriodicAction):
  """An action of a researcher's own: every second step, the loss, the state's
  step and the evaluation metrics seen so far."""

  def __init__(self, end_at: int = 0):
    self.seen = []
    self.calls = 0
    self.end_at = end_at
    self.closed = False

  def each_step(self, step, metrics):
    self.calls += 1

  def due(self, step):
    return step % 2 == 0

  def act(self, done):
    loss = float(jax.device_get(done.metrics['loss']))
    self.seen.append((done.step, int(done.run.state.step), loss))
    return done.step == self.end_at

  def close(self):
    self.closed = True


@pytest.mark.slow
def test_an_action_of_your_own_runs_where_it_is_due_and_can_end_the_loop(tmp_path):
  config = tiny_config(total_steps=6, log_every=1, eval_every=100, checkpoint_every=100)
  action = RecordEveryTwo()
  results = trainer.train_and_evaluate(config, str(tmp_path / 'run'), actions=[action])
  assert results['step'] == 6
  logged = losses_by_step(str(tmp_path / 'run'))
  assert [(step, state_step) for step, state_step, _ in action.seen] == [(2, 2), (4, 4), (6, 6)]
  for step, _, loss in action.seen:
    assert loss == pytest.approx(logged[step], rel=1e-6)
  assert action.calls == 6 and action.closed

  ending = RecordEveryTwo(end_at=4)
  config = tiny_config(total_steps=6, log_every=100, eval_every=100, checkpoint_every=100)
  assert trainer.train_and_evaluate(config, str(tmp_path / 'ended'), actions=[ending]) is None
  assert [step for step, _, _ in ending.seen] == [2, 4] and ending.closed


def test_the_built_in_actions_are_due_where_the_config_says():
  assert [s for s in range(1, 11) if loop_actions.is_due(s, 4, 10)] == [4, 8, 10]
  stop = loop_actions.StopAfter(3, 10, guard=None)
  assert [s for s in range(1, 11) if stop.due(s)] == list(range(3, 10))
  assert not any(loop_actions.StopAfter(None, 10, guard=None).due(s) for s in range(1, 11))
  log = loop_actions.LogProgress(5, 12, tokens_per_step=1, cost=None, peak_flops=None)
  assert [s for s in range(1, 13) if log.due(s)] == [5, 10, 12]
  assert not log.paused and not log.saves
  assert loop_actions.SaveCheckpoint(5, 12, guard=None).saves


@pytest.mark.slow
def test_the_parameter_norm_example_of_extending_writes_its_scalar(tmp_path):
  """docs/examples/parameter_norm_action.py, as docs/extending.md shows it."""
  path = REPO_ROOT / 'docs' / 'examples' / 'parameter_norm_action.py'
  spec = importlib.util.spec_from_file_location('parameter_norm_action', path)
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  workdir = str(tmp_path / 'run')
  config = tiny_config(total_steps=7, log_every=100, eval_every=100, checkpoint_every=100)
  example.train_with_parameter_norm(config, workdir, every=3)
  norms = {m['step']: m['param_norm'] for m in read_metrics(workdir) if 'param_norm' in m}
  assert sorted(norms) == [3, 6, 7]
  _, params = final_params(workdir, config)
  np.testing.assert_allclose(norms[7], float(optax.tree.norm(params)), rtol=1e-5)
