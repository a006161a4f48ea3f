"""The train step compiled before the loop: memory checked against the
device's, out-of-memory errors in one line, FLOPs for MFU, profiler traces."""

import os

import jax
import pytest
from run_helpers import tiny_config
from run_helpers import typed

from linformer_jax import run_folder
from linformer_jax.errors import ConfigError
from linformer_jax.training import compiled_step
from linformer_jax.training import run_builder
from linformer_jax.training import trainer
from linformer_jax.training import training_run


@pytest.mark.parametrize(
    'kind, peak',
    [
        ('NVIDIA H100 80GB HBM3', 989e12),
        ('NVIDIA A100-SXM4-80GB', 312e12),
        ('TPU v5 lite', 197e12),
        ('TPU v5p', 459e12),
        ('TPU v4', 275e12),
        ('TPU v6 lite', 918e12),
        ('cpu', None),
    ],
)
def test_the_peak_of_each_device_kind(kind, peak):
  assert compiled_step.peak_flops(kind) == peak


def test_a_step_that_does_not_fit_stops_before_the_workdir_is_written(tmp_path, monkeypatch):
  # 256 KiB beside the state the host already holds (0.3 MiB): the step needs 1.4 MiB.
  monkeypatch.setattr(compiled_step, 'device_memory_bytes', lambda device: (2**18, 'a test'))
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError) as error:
    trainer.train_and_evaluate(tiny_config(), str(workdir))
  message = str(error.value)
  assert 'The train step needs' in message and 'GiB per device' in message
  assert '0.00 GiB is there (a test)' in message
  assert '--config.batch_size=4' in message and '--config.model.max_len=32' in message
  assert not (workdir / 'config.json').exists() and not (workdir / 'metrics.jsonl').exists()


def test_the_step_cost_comes_from_xla(tmp_path):
  run = training_run.TrainingRun(run_builder.build_parts(tiny_config()), str(tmp_path))
  try:
    key = jax.random.PRNGKey(0)
    _, cost = compiled_step.compile_train_step(run, key)
  finally:
    run.store.close()
  # tiny: 2 layers of width 32 over 4 x 32 tokens, forward and backward:
  # at least 3 x 2 x (tokens) x (dense weights of the layers).
  dense = 2 * (4 * 32 * 32 + 2 * 32 * 64)
  assert cost.flops > 3 * 2 * 128 * dense
  assert cost.argument_bytes > 4 * 28_132  # the parameters alone, float32
  assert cost.temporary_bytes > 0


def test_an_out_of_memory_error_becomes_one_line_naming_what_to_change():
  settings = typed(tiny_config())
  error = jax.errors.JaxRuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 289.00GiB.\nmore lines'
  )
  assert compiled_step.is_out_of_memory(error)
  assert not compiled_step.is_out_of_memory(jax.errors.JaxRuntimeError('INTERNAL: other'))
  message = str(compiled_step.out_of_memory_error(error, settings))
  assert '\n' not in message and 'allocate 289.00GiB' in message
  assert '--config.batch_size=4' in message


@pytest.mark.slow
def test_profile_steps_write_a_trace_tensorboard_reads(tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(
      tiny_config(total_steps=4, warmup_steps=1, profile_steps=(2, 3), eval_every=4), str(workdir)
  )
  traces = [
      name
      for folder, _, names in os.walk(run_folder.RunFolder(str(workdir)).profile)
      for name in names
      if name.endswith('.xplane.pb')
  ]
  assert len(traces) == 1


@pytest.mark.long
@pytest.mark.slow
def test_a_profile_window_that_spans_a_resume_traces_the_rest_of_it(tmp_path):
  """Stopped at step 2 inside the window (2, 3) and resumed: the resumed run
  traces step 3 instead of stopping a trace it never started; one that
  stops inside the window leaves no trace running."""
  workdir = str(tmp_path / 'run')
  config = tiny_config(total_steps=4, warmup_steps=1, profile_steps=(2, 3), eval_every=4)
  assert trainer.train_and_evaluate(config, workdir, stop_after=2) is None
  jax.profiler.start_trace(str(tmp_path / 'probe'))  # raises if the run left one running
  jax.profiler.stop_trace()
  assert trainer.train_and_evaluate(config, workdir)['step'] == 4


@pytest.mark.parametrize('steps', [(3,), (0, 2), (4, 2), ('a', 'b')])
def test_bad_profile_steps_are_refused(tmp_path, steps):
  with pytest.raises(ConfigError, match='config.profile_steps'):
    trainer.train_and_evaluate(tiny_config(profile_steps=steps), str(tmp_path / 'run'))


@pytest.mark.long
def test_scanned_layers_count_every_layers_flops(tmp_path):
  """XLA's cost analysis counts a loop body once; a scanned run's FLOPs are
  those of the same step with a Python loop over the layers."""
  costs = {}
  for scan in (False, True):
    run = training_run.TrainingRun(
        run_builder.build_parts(tiny_config(**{'model.scan_layers': scan})),
        str(tmp_path / str(scan)),
    )
    try:
      _, costs[scan] = compiled_step.compile_train_step(run, jax.random.PRNGKey(0))
    finally:
      run.store.close()
  assert costs[True].flops == pytest.approx(costs[False].flops, rel=1e-6)


def test_an_opaque_kernel_step_is_counted_on_the_host_as_the_einsum_step():
  """cuDNN's and the Pallas kernels are one call to XLA's cost analysis (and
  XLA:GPU counts nothing for a lowered step): such a step's FLOPs are the same
  step's with the einsum attention, counted on this host's CPU."""
  settings = typed(tiny_config(**{'model.attention_kernel': 'einsum'}))
  lowered = compiled_step.lowered_train_step(settings)
  einsum = compiled_step.step_flops(settings, lowered)
  assert einsum > 0
  for kernel in compiled_step.OPAQUE_KERNELS:
    assert compiled_step.step_flops(settings, lowered, attention_kernel=kernel) == einsum
  assert compiled_step.host_step_flops(typed(tiny_config()), 2) == einsum / 2


def test_the_host_count_takes_the_key_of_any_prng_implementation():
  """Under JAX_DEFAULT_PRNG_IMPL=rbg the trainer's key is (4,) words, not 2:
  the analyses lower the step for the key the trainer passes. (XLA counts the
  two generators' random bits differently: 7% of this tiny step.)"""
  settings = typed(tiny_config())
  threefry = compiled_step.host_step_flops(settings, 1)
  with jax.default_prng_impl('rbg'):
    assert compiled_step.host_step_flops(settings, 1) == pytest.approx(threefry, rel=0.1)


def test_peak_device_memory_is_none_on_a_cpu():
  assert compiled_step.peak_device_bytes() is None
