"""Skipped non-finite steps, the spike rule, the kept pre-spike checkpoint,
and going on from the divergence error's own command (docs/reliability.md)."""

import math
import os
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from run_helpers import losses_by_step
from run_helpers import tiny_config
from run_helpers import tiny_flags

from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import run_config
from linformer_jax.training import train_steps


class FakeStore:
  """The CheckpointStore methods the guard uses, over a list of kept steps."""

  directory = '/run/checkpoints'

  def __init__(self, steps):
    self.steps = list(steps)
    self.protected = set()

  def wait(self):
    pass

  def all_steps(self):
    return sorted(self.steps)

  def protected_steps(self):
    return sorted(self.protected)

  def protect(self, step):
    self.protected.add(step)

  def unprotect(self, step):
    self.protected.discard(step)


def _guard(store, **overrides):
  return divergence.DivergenceGuard(tiny_config(**overrides), '/run', store)


def _feed(guard, losses, first_step=1, finite=None):
  for offset, loss in enumerate(losses):
    ok = math.isfinite(loss) if finite is None else finite[offset]
    guard.add(first_step + offset, {'finite': jnp.bool_(ok), 'loss': jnp.float32(loss)})
  guard.check()


def test_the_spike_rule():
  assert divergence.is_spike(float('nan'), [], 2.0)
  assert divergence.is_spike(float('inf'), [5.0], 0.0)
  assert not divergence.is_spike(100.0, [], 2.0)  # nothing to compare with
  assert not divergence.is_spike(9.9, [5.0, 5.0], 2.0)
  assert divergence.is_spike(10.1, [5.0, 5.0], 2.0)
  assert not divergence.is_spike(1e9, [5.0], 0.0)  # factor 0: only NaN/inf


def test_isolated_bad_steps_are_skipped_and_a_streak_stops_the_run():
  store = FakeStore([1, 2, 3])
  guard = _guard(store, max_skipped_steps=2)
  _feed(guard, [5.0, 5.0, float('nan'), float('nan'), 5.0, float('nan')])
  with pytest.raises(divergence.NonFiniteLossError) as error:
    _feed(guard, [float('nan'), float('nan')], first_step=7)
  message = str(error.value)
  assert 'at step 6 the training loss is nan' in message and 'steps 6..8' in message
  assert '\n' not in message


def test_a_spike_protects_the_newest_checkpoint_from_two_steps_before():
  """The loss of step t is measured on the state of step t - 1."""
  store = FakeStore([2, 4, 6, 8])
  guard = _guard(store, max_skipped_steps=0, spike_factor=2.0)
  _feed(guard, [5.0] * 8 + [50.0])  # step 9 spikes: states 8 and later are suspect
  assert store.protected_steps() == [6]
  store.steps = [6, 10, 12]
  _feed(guard, [60.0, 5.0, 5.0], first_step=10)  # a spike soon after moves nothing
  assert store.protected_steps() == [6]
  with pytest.raises(divergence.NonFiniteLossError) as error:
    _feed(guard, [float('inf')], first_step=13)
  assert error.value.flags == ['--config.restore_step=6', '--config.learning_rate=0.0002']
  assert 'steps 6, 10, 12; step 6 is from before the divergence' in str(error.value)


def test_an_update_that_overflows_keeps_the_step_before_it():
  store = FakeStore([1])
  guard = _guard(store, max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='step 2 the parameters') as error:
    _feed(guard, [5.0, 5.0], finite=[True, False])
  assert error.value.flags[0] == '--config.restore_step=1'


def test_with_nothing_from_before_the_divergence_it_says_start_again():
  guard = _guard(FakeStore([1]), max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='none is from before') as error:
    _feed(guard, [5.0, float('nan')])
  assert error.value.flags[0] == '--workdir=/run-restart'
  guard = _guard(FakeStore([]), max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='No checkpoint was saved'):
    _feed(guard, [float('nan')])


def test_the_command_to_go_on_replaces_the_flags_it_names():
  error = divergence.NonFiniteLossError('x', ['--config.restore_step=3', '--workdir=b c'])
  argv = ['--config', 'configs/tiny.py', '--workdir', 'a', '--config.restore_step=1']
  assert divergence.command_to_go_on(error, argv) == (
      'python -m linformer_jax.train --config configs/tiny.py --config.restore_step=3 '
      "'--workdir=b c'"
  )


@pytest.mark.parametrize(
    'field,value',
    [
        ('max_skipped_steps', -1),
        ('restore_step', -2),
        ('spike_factor', 0.5),
        ('spike_factor', 1.0),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field, value):
  with pytest.raises(ConfigError, match=f'config.{field}='):
    run_config.validate(tiny_config(**{field: value}))


@pytest.mark.slow
def test_a_diverged_run_goes_on_from_the_command_its_error_gives(tmp_path, run_command):
  """learning_rate=1e12 (warm-up from 0 over 5 steps): step 2's update blows
  the weights up, step 3's loss is NaN. Steps 3..6 are skipped, then the run
  stops with one line naming step 1, kept past keep_checkpoints=2 although
  every step was saved. Its command, with a sane learning rate, trains on."""
  workdir = str(tmp_path / 'run')
  flags = [*tiny_flags(workdir), '--config.checkpoint_every=1', '--config.log_every=1']
  diverged = run_command('train', *flags, '--config.total_steps=8', '--config.learning_rate=1e12')
  assert diverged.returncode == 2, diverged.stderr
  assert 'Traceback' not in diverged.stderr
  errors = [line for line in diverged.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'steps 1, ' in errors[0], diverged.stderr
  command = shlex.split(errors[0].split('Go on with a lower learning rate: ', 1)[1])
  assert command[:3] == ['python', '-m', 'linformer_jax.train']
  assert '--config.restore_step=1' in command and '--config.learning_rate=1e+11' in command
  sane = [
      a if not a.startswith('--config.learning_rate=') else '--config.learning_rate=1e-3'
      for a in command[3:]
  ]
  went_on = run_command('train', *sane)
  assert went_on.returncode == 0, went_on.stderr
  losses = losses_by_step(workdir)
  assert sorted(losses) == list(range(1, 9)) and all(np.isfinite(list(losses.values())))
  assert sorted(os.listdir(tmp_path / 'run' / 'diverged_checkpoints' / 'from_1'))


def test_a_non_finite_step_leaves_the_parameters_and_optimizer_state_as_they_were():
  def loss_sums(variables, batch, *, deterministic, rngs=None):
    del deterministic, rngs
    loss = jnp.sum((variables['params']['w'] * batch['x']) ** 2)
    return {'loss_sum': loss, 'correct_sum': 0.0, 'weight_sum': jnp.sum(batch['weights'])}

  optimizer = optax.adam(0.1)
  params = {'w': jnp.ones(3)}
  state = train_steps.TrainState(
      step=jnp.int32(0), params=params, opt_state=optimizer.init(params), constants={}
  )
  step = lambda s, x: train_steps.train_step(
      s,
      {'x': x, 'weights': jnp.ones(1)},
      jnp.zeros(2, jnp.uint32),
      loss_sums=loss_sums,
      optimizer=optimizer,
  )
  good, metrics = step(state, jnp.ones((1, 3)))
  assert bool(metrics['finite']) and not np.allclose(good.params['w'], 1.0)
  skipped, metrics = step(good, jnp.full((1, 3), jnp.nan))
  assert not bool(metrics['finite']) and int(skipped.step) == 2
  np.testing.assert_array_equal(skipped.params['w'], good.params['w'])
  for new, old in zip(*(jax.tree_util.tree_leaves(s.opt_state) for s in (skipped, good))):
    np.testing.assert_array_equal(new, old)
