"""Skipped non-finite steps, the spike rule, the kept pre-spike checkpoint,
and going on from the divergence error's own command (docs/reliability.md)."""

import math
import os
import shlex
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from run_helpers import file_hashes
from run_helpers import losses_by_step
from run_helpers import tiny_config
from run_helpers import tiny_flags
from run_helpers import typed

from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.training import divergence
from linformer_jax.training import run_config
from linformer_jax.training import sound_steps
from linformer_jax.training import train_steps
from linformer_jax.training.sound_steps import SoundStepLedger


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

  def restore_config(self, step=None):
    del step
    return {}


class MemoryLedger(SoundStepLedger):
  """The workdir's ledger, kept in memory (the guard's workdir is not real)."""

  def __init__(self):
    super().__init__('/nonexistent/run')

  def write(self):
    pass


def _guard(store, **overrides):
  return divergence.DivergenceGuard(typed(tiny_config(**overrides)), '/run', store, MemoryLedger())


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
  assert message.endswith('add --config.restore_step=1 --config.learning_rate=0.0002.')
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
  assert error.value.restore_step == 6 and error.value.learning_rate == 2e-3
  assert 'steps 6, 10, 12; step 6 is from before the divergence' in str(error.value)


def test_an_update_that_overflows_keeps_the_step_before_it():
  store = FakeStore([1])
  guard = _guard(store, max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='step 2 the parameters') as error:
    _feed(guard, [5.0, 5.0], finite=[True, False])
  assert error.value.restore_step == 1


def test_with_nothing_from_before_the_divergence_it_says_start_again():
  guard = _guard(FakeStore([1]), max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='none is from before') as error:
    _feed(guard, [5.0, float('nan')])
  assert error.value.restart_workdir == '/run-restart' and error.value.restore_step is None
  guard = _guard(FakeStore([]), max_skipped_steps=0)
  with pytest.raises(divergence.NonFiniteLossError, match='No checkpoint was saved') as error:
    _feed(guard, [float('nan')])
  assert error.value.train_flags(1e-4) == ['--config.learning_rate=0.0001']


def test_the_command_to_go_on_replaces_the_flags_it_names():
  flags = ['--config.restore_step=3', '--workdir=b c']
  argv = ['--config', 'configs/tiny.py', '--workdir', 'a', '--config.restore_step=1']
  assert divergence.command_to_go_on(argv, flags) == (
      'python -m linformer_jax.train --config configs/tiny.py --config.restore_step=3 '
      "'--workdir=b c'"
  )
  argv += ['--config.learning_rate=1e12']
  assert divergence.command_to_go_on(argv, [], dropped=['--config.learning_rate']) == (
      'python -m linformer_jax.train --config configs/tiny.py --workdir a --config.restore_step=1'
  )


def test_the_advised_learning_rate_comes_down_to_a_sane_one_at_once():
  """An override above the config file's rate goes back to the file's; a rate
  far above any AdamW trains with comes down to 1e-3; else a tenth."""
  rate, why = divergence.advised_learning_rate(1e12, 2e-3, 'configs/tiny.py')
  assert rate is None and why.startswith("configs/tiny.py's own learning rate, 0.002")
  rate, why = divergence.advised_learning_rate(100.0)
  assert rate == 1e-3 and 'orders of magnitude' in why
  assert divergence.advised_learning_rate(2e-3, 2e-3)[0] == pytest.approx(2e-4)
  assert divergence.advised_learning_rate(5e-3, 1e-2)[0] == pytest.approx(5e-4)


def _ended_unsound(losses, eval_loss, saved_config=None):
  """A guard fed `losses`, step 5 kept (and recorded as the run saves it),
  and what `unsound_end` says of the run ending at step 5."""
  guard = _guard(FakeStore([5]), max_skipped_steps=0, spike_factor=2.0)
  if losses:
    _feed(guard, losses)
  guard.ledger.record(5, finite=True, param_norm=1.0, recent_losses=[], suspect='spiking')
  return guard, guard.unsound_end(5, eval_loss, saved_config)


def test_a_run_ending_on_a_diverged_unsound_step_says_so_and_records_it():
  """The loss spiked at step 3 and stayed high, finite: the error gives the
  numbers and, with no sound step, a new workdir."""
  guard, error = _ended_unsound([5.6, 5.5, 6.0e4, 5.2e4, 5.0e4], eval_loss=4.5e4)
  assert type(error) is divergence.DivergenceError  # pylint: disable=unidiomatic-typecheck
  assert str(error).startswith(
      'Training diverged: step 5, the last, is not sound (spiking); its validation loss 45,000 '
      'and its training loss 50,000 (above 69 nats: a perplexity above 1e30), against 5.55 '
      'before the loss spiked at step 3. No results were saved. Kept checkpoints in '
      '/run/checkpoints: steps 5; none is from before the divergence'
  )
  assert error.restart_workdir == '/run-restart' and error.learning_rate == 2e-3
  assert guard.ledger.diverged['step'] == 3
  assert guard.ledger.diverged['config']['learning_rate'] == 2e-3


def test_an_unsound_last_step_with_a_model_s_loss_keeps_its_results_with_a_warning(caplog):
  """Unsound by the spike rule's caution alone (the loss came back): no
  error, a warning; nothing recorded as diverged."""
  guard, error = _ended_unsound([5.6, 5.5, 60.0, 5.4, 5.3], eval_loss=5.4)
  assert error is None and guard.ledger.diverged is None
  assert 'Step 5, the last, is not sound (spiking); its results are saved' in caplog.text


def test_a_finished_run_run_again_on_a_diverged_step_records_the_step_s_own_config():
  """Nothing trained in this process (a run from before this check, whose
  divergence was never recorded): the evaluation decides, and the
  divergence is recorded with the config the step was trained with."""
  saved = {**tiny_config().to_dict(), 'learning_rate': 100.0}
  guard, error = _ended_unsound([], eval_loss=6.0e4, saved_config=saved)
  assert str(error).startswith('Training diverged: step 5, the last, is not sound (spiking); its')
  assert error.learning_rate == 100.0 and guard.ledger.diverged['config']['learning_rate'] == 100
  assert guard.ledger.diverged['step'] is None
  with pytest.raises(ConfigError, match="/run's run diverged, ending at step 5 and none of"):
    divergence.go_back(FakeStore([5]), typed(tiny_config()), '/run', guard.ledger)


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
    run_config.RunConfig.from_config(tiny_config(**{field: value}))


def test_the_ledger_doubts_non_finite_and_blown_up_steps_and_keeps_its_record(tmp_path):
  ledger = SoundStepLedger(str(tmp_path))
  ledger.record(1, finite=True, param_norm=10.0, recent_losses=[5.0])
  ledger.record(2, finite=True, param_norm=39.0, recent_losses=[5.0, 4.9])  # under 4x
  ledger.record(3, finite=True, param_norm=200.0, recent_losses=[])
  ledger.record(4, finite=False, param_norm=float('nan'), recent_losses=[])
  ledger.record(5, finite=True, param_norm=11.0, recent_losses=[], suspect='a spike')
  assert [ledger.is_sound(s) for s in range(1, 6)] == [True, True, False, False, False]
  assert 'parameter norm 200 is more than 4x' in ledger.why(3)
  assert ledger.why(5) == 'a spike' and ledger.newest_sound([1, 2, 3, 4, 5]) == 2
  assert ledger.mark_suspect([2, 3], 'later spike') == [2]
  ledger.diverged = {'step': 6, 'sound_step': 1, 'config': {}}
  ledger.write()
  again = SoundStepLedger(str(tmp_path))
  assert again.steps == ledger.steps and again.diverged == ledger.diverged
  assert again.recent_losses(1) == [5.0] and again.newest_sound([1, 2, 3], at_most=0) is None


def test_only_bookkeeping_fields_leave_the_training_settings_the_same():
  config = tiny_config().to_dict()
  assert sound_steps.same_training_settings(config, {**config, 'log_every': 1, 'restore_step': 3})
  assert not sound_steps.same_training_settings(config, {**config, 'learning_rate': 1e-4})
  changed_model = tiny_config(**{'model.num_heads': 4}).to_dict()
  assert not sound_steps.same_training_settings(config, changed_model)


def test_a_data_setting_a_source_declares_at_its_default_is_no_change():
  """A process that imported a classification source of one's own adds its
  config.data setting to every config it builds; at its default that is the
  config a run without it recorded (as for config.model settings)."""
  import_extensions(('docs/examples/more_letters_source.py',))
  config = tiny_config().to_dict()
  with_setting = {**config, 'data': {**config['data'], 'letters_per_example': 7}}
  assert sound_steps.same_training_settings(config, with_setting)
  assert sound_steps.same_training_settings(with_setting, config)
  changed = {**config, 'data': {**config['data'], 'letters_per_example': 9}}
  assert not sound_steps.same_training_settings(config, changed)


def test_a_resumed_guard_takes_up_the_losses_and_suspicion_of_its_step():
  ledger = MemoryLedger()
  ledger.record(4, finite=True, param_norm=1.0, recent_losses=[5.0, 5.0], suspect='spiking')
  guard = divergence.DivergenceGuard(
      typed(tiny_config(spike_factor=2.0)), '/run', FakeStore([2, 4]), ledger, resumed_step=4
  )
  assert guard.recent_losses() == [5.0, 5.0] and guard.suspicion(5)
  _feed(guard, [5.0] * divergence.SPIKE_WINDOW, first_step=5)
  assert not guard.suspicion(5 + divergence.SPIKE_WINDOW)
  _feed(guard, [11.0], first_step=30)  # 2.2x the mean of the resumed losses: a spike
  assert guard.suspicion(30) == 'saved while the loss was spiking (since step 30)'


def _error_line(process):
  assert process.returncode == 2, process.stdout + process.stderr
  assert 'Traceback' not in process.stdout + process.stderr, process.stderr
  errors = [line for line in process.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1, process.stderr
  return errors[0]


def _printed_command(line):
  """The flags of the `train` command the error line ends with."""
  return shlex.split(line.split(' python -m linformer_jax.train ', 1)[1])


def _with_learning_rate(flags, rate):
  return [f for f in flags if not f.startswith('--config.learning_rate=')] + [
      f'--config.learning_rate={rate}'
  ]


def _healthy(workdir):
  losses = losses_by_step(workdir)
  assert sorted(losses) == list(range(1, 9)) and all(np.isfinite(list(losses.values())))
  assert losses[8] < math.log(260), losses  # below a uniform guess over the 260 bytes


@pytest.fixture(scope='module')
def diverged_run(tmp_path_factory, run_command):
  """learning_rate=1e12 (warm-up from 0 over 5 steps), saving every step: step
  2's update blows the weights up, step 3's loss is NaN, steps 3..6 are
  skipped, and the run stops keeping steps 1, 4 and 5 (step 1 past
  keep_checkpoints=2). Returns (workdir, its flags, the error line)."""
  workdir = tmp_path_factory.mktemp('diverged') / 'run'
  flags = [
      *tiny_flags(workdir),
      '--config.checkpoint_every=1',
      '--config.log_every=1',
      '--config.total_steps=8',
      '--config.learning_rate=1e12',
  ]
  line = _error_line(run_command('train', *flags))
  assert 'steps 1, 4, 5; step 1 is from before the divergence' in line, line
  return workdir, flags, line


@pytest.mark.slow
def test_a_diverged_workdir_keeps_its_sound_step_across_re_runs(
    diverged_run, tmp_path, run_command
):
  """The same command twice is refused untouched; its advice goes back to the
  config file's own rate, not a tenth of the override. A tenth (1e11)
  diverges again and still keeps step 1; the command its error prints reaches
  a healthy loss."""
  source, flags, line = diverged_run
  workdir = tmp_path / 'run'
  shutil.copytree(source, workdir)
  flags = [str(workdir) if f == str(source) else f for f in flags]
  before = file_hashes(workdir)
  for _ in range(2):
    refused = _error_line(run_command('train', *flags))
    assert 'Refused' in refused and 'step 1 is the newest sound one' in refused, refused
    assert file_hashes(workdir) == before
  assert "Go on with configs/tiny.py's own learning rate, 0.002" in refused, refused
  printed = _printed_command(refused)
  assert '--config.restore_step=1' in printed
  assert not any(f.startswith('--config.learning_rate') for f in printed), printed
  again = _error_line(run_command('train', *_with_learning_rate(printed, '1e11')))
  assert 'step 1 is from before the divergence' in again, again
  assert '1' in os.listdir(workdir / 'checkpoints')
  went_on = run_command('train', *_printed_command(again))
  assert went_on.returncode == 0, went_on.stderr
  _healthy(workdir)
  assert sorted(os.listdir(workdir / 'diverged_checkpoints' / 'from_1'))


@pytest.mark.slow
def test_a_changed_learning_rate_alone_goes_back_to_the_sound_step(
    diverged_run, tmp_path, run_command
):
  source, flags, _ = diverged_run
  workdir = tmp_path / 'run'
  shutil.copytree(source, workdir)
  flags = [str(workdir) if f == str(source) else f for f in flags]
  went_on = run_command('train', *_with_learning_rate(flags, '1e-3'))
  assert went_on.returncode == 0, went_on.stderr
  assert 'goes on from step 1, its newest sound checkpoint' in went_on.stderr
  _healthy(workdir)
  assert sorted(os.listdir(workdir / 'diverged_checkpoints' / 'from_1')) == ['4', '5']
  ledger = SoundStepLedger(str(workdir))
  assert ledger.diverged is None and all(ledger.is_sound(s) for s in ledger.steps)


def test_a_restore_step_that_is_not_sound_is_refused_naming_the_sound_ones(diverged_run):
  source, _, _ = diverged_run
  store = FakeStore([1, 4, 5])
  settings = typed(tiny_config(restore_step=4, learning_rate=1e12))
  with pytest.raises(ConfigError, match=r'step 4 of .* is not sound \(saved while the loss'):
    divergence.go_back(store, settings, str(source), SoundStepLedger(str(source)))


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
