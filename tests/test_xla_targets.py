"""Compiling the train step for a TPU slice and an H100 from this CPU host.

The set-up installs XLA's GPU and TPU plugins (`make xla-targets`, a no-op
once they are there), then `mesh_memory --target` compiles a tiny model for a
4-chip v5e slice and one H100 in a process of its own (the plugins must be on
the path before JAX starts a backend, which this process has done).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from linformer_jax import mesh_memory
from linformer_jax.analysis import xla_targets
from linformer_jax.errors import ConfigError
from linformer_jax.training import compiled_step
from linformer_jax.units import GIB

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    'name, platform, topology, chips',
    [
        ('v5e-1', 'tpu', 'v5e:1x1', 1),
        ('v5e-4', 'tpu', 'v5e:2x2', 4),
        ('v5e-8', 'tpu', 'v5e:2x4', 8),
        ('v4-32', 'tpu', 'v4:2x2x4', 16),
        ('v5p-64', 'tpu', 'v5p:2x4x4', 32),
        ('v6e-256', 'tpu', 'v6e:16x16', 256),
        ('h100', 'cuda', '1x1x1', 1),
        ('H100x8', 'cuda', '1x1x8', 8),
        ('h100x16', 'cuda', '1x2x8', 16),
    ],
)
def test_target_names_give_slices(name, platform, topology, chips):
  target = xla_targets.parse_target(name)
  assert (target.platform, target.topology, target.chips) == (platform, topology, chips)


def test_a_multi_slice_target_counts_every_slice():
  target = xla_targets.parse_target('2xv5e-8')
  assert (target.topology, target.slices, target.chips) == ('v5e:2x4', 2, 16)
  assert xla_targets.parse_target('v4-8').slices == 1


@pytest.mark.parametrize('name', ['v5e-3', 'v4-31', 'a100', 'h100x12', 'v5e', 'tpu', '0xv5e-4'])
def test_bad_target_names_say_what_to_use(name):
  with pytest.raises(ConfigError, match=re.escape(f'--target={name!r}')):
    xla_targets.parse_target(name)


def test_gpu_memory_is_the_share_jax_allocates():
  target = xla_targets.parse_target('h100')
  usable = target.usable_bytes_per_device(1)
  assert usable == int(xla_targets.H100_MEMORY_BYTES * xla_targets.GPU_MEMORY_FRACTION)
  v4 = xla_targets.parse_target('v4-8')
  assert v4.usable_bytes_per_device(2) == 16 * GIB  # one TensorCore of a 32 GiB chip


def _linear_measure(fixed, per_sequence, usable, refuse_above=None):
  """measure(batch) of a step whose memory is fixed + batch x per_sequence;
  past `refuse_above` bytes the 'compiler' refuses, reporting temporaries only."""
  calls = []

  def measure(batch):
    calls.append(batch)
    total = fixed + batch * per_sequence
    if refuse_above is not None and total > refuse_above:
      return mesh_memory.StepMemory(
          batch, 0, total - 100, usable, False, 1.0, None, 0.0, refused=True
      )
    return mesh_memory.StepMemory(batch, 100, total - 100, usable, total <= usable, 1.0, None, 0.0)

  return measure, calls


@pytest.mark.parametrize('start', [1, 3, 8, 40, 64])
def test_largest_batch_is_the_last_that_fits(start):
  measure, calls = _linear_measure(fixed=1000, per_sequence=300, usable=10_000)
  found = mesh_memory.largest_batch(measure, measure(start))
  assert found['batch'] == 30  # 1000 + 30 x 300 = 10,000 fits; 31 does not
  assert found['bytes_per_sequence'] == 300
  assert found['total_bytes'] == 10_000 and found['exact']
  assert 31 in calls and found['compiles'] <= mesh_memory.MAX_SEARCH_COMPILES


def test_a_prediction_that_misses_is_stepped_down_from_not_bisected():
  """Memory a little above the line through the first two batches at large
  batches (as XLA:GPU's was at n = 512: 167 predicted, 59.35 of 59.32 GiB):
  the search steps down from the prediction, not back from the last fit."""
  calls = []

  def total(batch):
    return 1000 + 300 * batch + 5 * max(batch - 100, 0)

  def measure(batch):
    calls.append(batch)
    return mesh_memory.StepMemory(
        batch, 100, total(batch) - 100, 51_000, total(batch) <= 51_000, 1.0, None, 0.0
    )

  found = mesh_memory.largest_batch(measure, measure(32))
  assert found['batch'] == max(b for b in range(1, 200) if total(b) <= 51_000) and found['exact']
  assert calls == [32, 64, 166, 165], calls


def test_largest_batch_through_compiler_refusals():
  measure, _ = _linear_measure(fixed=1000, per_sequence=300, usable=10_000, refuse_above=10_000)
  assert mesh_memory.largest_batch(measure, measure(16))['batch'] == 30


def test_largest_batch_says_when_the_compiles_ran_out():
  # Memory that stops growing (a compiler rematerialising to fit): every batch fits.
  def measure(batch):
    total = 1000 + 300 * min(batch, 8)
    return mesh_memory.StepMemory(batch, 100, total - 100, 10_000, True, 1.0, None, 0.0)

  found = mesh_memory.largest_batch(measure, measure(4))
  assert not found['exact'] and found['compiles'] == mesh_memory.MAX_SEARCH_COMPILES
  assert found['batch'] >= 30


def test_largest_batch_is_zero_when_one_sequence_does_not_fit():
  measure, _ = _linear_measure(fixed=1000, per_sequence=300, usable=1200)
  found = mesh_memory.largest_batch(measure, measure(4))
  assert found == {
      'batch': 0,
      'exact': True,
      'bytes_per_sequence': None,
      'total_bytes': None,
      'compiles': 3,
  }


def test_xla_tpu_refusals_give_what_the_step_needs():
  temporaries_only = RuntimeError(
      'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO '
      'temporaries (29.90G) exceeds available HBM (15.75G).'
  )
  with_breakdown = RuntimeError(
      'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory in memory space hbm. '
      'Used 15.75G of 15.75G hbm. Exceeded hbm capacity by 2.56M.\n\n'
      'Total hbm usage >= 16.00G:\n    reserved        258.00M \n    program          14.47G \n'
      '    arguments         1.28G \n'
  )
  need = compiled_step.out_of_memory_need
  assert need(temporaries_only) == (0, int(29.90 * GIB))
  assert need(with_breakdown) == (int(1.28 * GIB), int(14.47 * GIB))
  assert need(RuntimeError('RESOURCE_EXHAUSTED: something else')) is None
  assert need(RuntimeError('INVALID_ARGUMENT: program 1.0G')) is None


@pytest.fixture(scope='module')
def plugins():
  """XLA's GPU and TPU plugins, installed by the Makefile if missing."""
  folder = xla_targets.plugin_folder()
  if not (folder / '.installed').exists():
    subprocess.run(['make', '-C', str(REPO), 'xla-targets'], check=True)
  return folder


def _mesh_memory(*flags, config='configs/tiny.py'):
  env = {**os.environ, 'PYTHONPATH': str(REPO)}
  env.pop('JAX_PLATFORMS', None)
  env.pop('XLA_FLAGS', None)
  return subprocess.run(
      [sys.executable, '-m', 'linformer_jax.mesh_memory', '--config', config, *flags],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )


def _rows(stdout):
  return {
      cells[0]: cells
      for line in stdout.splitlines()
      if line.startswith('| ') and not line.startswith('| target')
      for cells in [[cell.strip() for cell in line.strip('|').split('|')]]
  }


@pytest.mark.long
def test_tiny_model_compiles_for_a_v5e_slice_and_an_h100(plugins):
  del plugins
  result = _mesh_memory('--target=v5e-4', '--target=h100', '--config.model.dtype=bfloat16')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'v5e-4: 4 x TPU v5 lite (v5e:2x2)' in result.stdout
  assert 'h100: 1 x NVIDIA H100 80GB HBM3 (1x1x1)' in result.stdout
  rows = _rows(result.stdout)
  for target, batch in (('v5e-4', '1'), ('h100', '4')):  # tiny.py's batch of 4 over the devices
    cells = rows[target]
    assert cells[2] == batch and cells[7] == 'yes', cells
    assert cells[5].endswith('iB') and float(cells[5].split()[0]) > 0, cells
    assert float(cells[8]) > 0, cells
  assert rows['v5e-4'][9] != '-'  # XLA:TPU's own FLOP count
  assert rows['h100'][9] == '-'


@pytest.mark.long
@pytest.mark.parametrize('attention', ['full', 'linformer'])
def test_auto_takes_cudnn_in_a_step_compiled_for_an_h100(plugins, attention):
  """The kernel follows the devices the step is compiled for, not this CPU host."""
  del plugins
  result = _mesh_memory(
      '--target=h100',
      f'--config.model.attention={attention}',
      '--config.model.attention_kernel=auto',
      '--config.model.dtype=bfloat16',
      '--config.model.num_heads=2',
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'attention kernel cudnn (auto: cuDNN fused attention on gpu)' in result.stdout
  assert _rows(result.stdout)['h100'][7] == 'yes'


@pytest.mark.long
def test_auto_takes_the_pallas_kernel_in_a_step_compiled_for_a_v5e_chip(plugins):
  """XLA:TPU compiles JAX's Pallas flash attention ahead of time from this host."""
  del plugins
  result = _mesh_memory(
      '--target=v5e-1',
      '--config.model.max_len=128',
      '--config.model.projected_len=128',
      '--config.model.dtype=bfloat16',
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'attention kernel pallas (auto: Pallas flash attention on tpu)' in result.stdout
  assert _rows(result.stdout)['v5e-1'][7] == 'yes'


def test_unknown_target_is_one_line():
  result = _mesh_memory('--target=v7x-3')
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith("error: --target='v7x-3'")
  assert 'Traceback' not in result.stderr


def test_every_compile_of_a_search_is_one_progress_line():
  fits = mesh_memory.StepMemory(32, GIB, 20 * GIB, 60 * GIB, True, 1e12, None, 41.25)
  refused = mesh_memory.StepMemory(64, 0, 70 * GIB, 60 * GIB, False, 2e12, None, 3.0, refused=True)
  too_big = mesh_memory.StepMemory(48, GIB, 62 * GIB, 60 * GIB, False, 2e12, None, 40.0)
  assert fits.progress_text() == 'batch 32 per device: fits, 21.00 GiB, compiled in 41.2 s'
  assert refused.progress_text().startswith('batch 64 per device: refused by XLA, 70.00 GiB')
  assert too_big.progress_text().startswith('batch 48 per device: does not fit, 63.00 GiB')


# What users launch on a slice: configs/roberta_base.py (bfloat16, 64-wide heads,
# and no attention dropout, which only the einsums apply, so 'auto' takes a fused
# kernel), cut to 2 layers to compile in about a minute.
ROBERTA_TWO_LAYERS = (
    '--config.model.attention_dropout_rate=0.0',
    '--config.batch_size=8',
    '--config.model.max_len=1024',
    '--config.model.projected_len=128',
    '--config.model.num_layers=2',
)
ATTENTION_KINDS = {
    'linformer': (),
    'transformer': ('--config.model.attention=full',),
    'causal_linformer': (
        '--config.task=causal_lm',
        '--config.model.causal=True',
        '--config.model.block_len=256',  # a block holds the k = 128 summaries' tokens
    ),
}
# Two slices of a v5e-4 (multi-slice): 'data' spans the slices.
MULTI_SLICE = '2xv5e-4'
# Slices and meshes (data, model); -1 takes the remaining devices: (2, 2) on a
# v5e-4, (4, 2) on a v5e-8. A v4-8 is a 3D slice of 4 chips, 8 TensorCores.
SLICE_MESHES = (
    ('v5e-4', '-1,1'),
    ('v5e-4', '-1,2'),
    ('v5e-8', '-1,1'),
    ('v5e-8', '-1,2'),
    ('v4-8', '-1,1'),
    ('h100x8', '4,2'),
    (MULTI_SLICE, '-1,2'),
)
# `make test` compiles one cell, at one layer of 2 heads of 64 and n = 256: the same
# kernel in the same shard_map, one head per device, in a quarter of RoBERTa's compile
# time (12 s against 48 s for its 12 heads); `make test-all` every kind on every slice.
REPRESENTATIVE_CELL = ('linformer', 'v5e-4', '-1,2')
REPRESENTATIVE_SIZE = {
    '--config.model.num_layers': '1',
    '--config.model.max_len': '256',
    '--config.model.hidden_dim': '128',
    '--config.model.num_heads': '2',
    '--config.model.mlp_dim': '256',
}


def _roberta_flags(cell):
  """ROBERTA_TWO_LAYERS, at REPRESENTATIVE_SIZE for the representative cell."""
  if cell != REPRESENTATIVE_CELL:
    return ROBERTA_TWO_LAYERS
  return tuple(
      f'{name}={value}'
      for name, value in {
          **dict(flag.split('=', 1) for flag in ROBERTA_TWO_LAYERS),
          **REPRESENTATIVE_SIZE,
      }.items()
  )


def _default_kernel_line(kind, target):
  if kind == 'causal_linformer':
    platform = 'gpu' if target.startswith('h100') else 'tpu'
    return f'attention kernel einsum (auto: einsum on {platform}, since a causal model'
  if target.startswith('h100'):
    return 'attention kernel cudnn (auto: cuDNN fused attention on gpu)'
  return 'attention kernel pallas (auto: Pallas flash attention on tpu)'


@pytest.mark.parametrize(
    'kind, target, mesh',
    [
        pytest.param(
            kind,
            target,
            mesh,
            marks=() if (kind, target, mesh) == REPRESENTATIVE_CELL else pytest.mark.long,
        )
        for kind in ATTENTION_KINDS
        for target, mesh in SLICE_MESHES
    ],
)
def test_the_default_kernel_compiles_on_a_multi_chip_slice(plugins, kind, target, mesh):
  """The train step of a RoBERTa-sized model with the default kernel, compiled
  for the slice: a fused kernel runs per device inside a shard_map over the
  batch ('data') and heads ('model'), which a Mosaic kernel needs to compile."""
  del plugins
  result = _mesh_memory(
      f'--target={target}',
      f'--meshes={mesh}',
      *_roberta_flags((kind, target, mesh)),
      *ATTENTION_KINDS[kind],
      config='configs/roberta_base.py',
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert _default_kernel_line(kind, target) in result.stdout, result.stdout
  cells = _rows(result.stdout)[target]
  assert cells[7] == 'yes', cells  # fits
  assert float(cells[8]) > 0, cells  # the model's GFLOP per device


@pytest.mark.long
def test_the_default_kernel_compiles_with_fsdp_on_a_slice(plugins):
  """Parameters and optimizer state split over 'data' too (config.fsdp)."""
  del plugins
  result = _mesh_memory(
      '--target=v5e-8',
      '--meshes=-1,2',
      '--config.fsdp=True',
      *ROBERTA_TWO_LAYERS,
      config='configs/roberta_base.py',
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert _default_kernel_line('linformer', 'v5e-8') in result.stdout
  assert _rows(result.stdout)['v5e-8'][7] == 'yes'


@pytest.mark.slow
def test_a_mesh_whose_data_axis_cannot_span_the_slices_is_one_line(plugins):
  del plugins
  result = _mesh_memory(f'--target={MULTI_SLICE}', '--meshes=1,8', '--config.batch_size=8')
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      'error: config.mesh_shape=(1, 8) on 2 TPU slices: the data axis (1) spans the slices, '
      'so it must be a multiple of 2; use e.g. (2, 4).'
  )
