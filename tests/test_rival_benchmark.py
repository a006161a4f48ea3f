"""The rivals benchmark: its measured rows, its exponent fit, its table and its flags.

The tests that compile and run the step, or start the command, are marked slow
(`pytest -m "not slow"` leaves them out); compiling for a TPU chip is long.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from linformer_jax import rival_benchmark
from linformer_jax.analysis import rival_benchmark_report
from linformer_jax.analysis import xla_targets
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.rival_benchmark import RivalBenchmarkSettings

# Performer holds fixed random features (a 'constants' collection the step must pass).
TINY = dict(
    seq_lens=(64, 128),
    kinds=('linformer', 'performer'),
    projected_len=32,
    num_layers=1,
    hidden_dim=16,
    num_heads=2,
    mlp_dim=32,
    repeats=1,
    kind_settings=('performer_features=16',),
)


@pytest.fixture(scope='module')
def tiny_rows():
  return rival_benchmark.run(RivalBenchmarkSettings(**TINY))


@pytest.mark.slow
def test_every_kind_is_timed_at_every_n_with_its_compiled_memory(tiny_rows):
  assert [(row['kind'], row['seq_len']) for row in tiny_rows] == [
      ('full', 64),
      ('linformer', 64),
      ('performer', 64),
      ('full', 128),
      ('linformer', 128),
      ('performer', 128),
  ]
  for row in tiny_rows:
    assert row['note'] == '', row
    assert row['time_ms'] > 0 and row['steps_per_s'] == pytest.approx(1e3 / row['time_ms'])
    assert row['argument_bytes'] > 0 and row['temp_bytes'] > 0 and row['flops'] > 0
    assert row['memory_bytes'] == row['argument_bytes'] + row['temp_bytes']
    assert row['memory_per_sequence'] == row['memory_bytes']  # batch 1
    assert row['attention_kernel'] == 'einsum'
  by_key = {(row['kind'], row['seq_len']): row for row in tiny_rows}
  # Full attention's n x n logits: doubling n more than doubles its step's FLOPs.
  assert by_key['full', 128]['flops'] > 2 * by_key['full', 64]['flops']


@pytest.mark.slow
def test_the_table_has_a_row_per_n_and_a_column_group_per_kind(tiny_rows):
  lines = rival_benchmark_report.format_table(tiny_rows).splitlines()
  assert lines[0] == (
      '| n | full steps/s | full MiB | linformer steps/s | linformer MiB | '
      'performer steps/s | performer MiB |'
  )
  assert len(lines) == 2 + 2  # header, separator, one row per n
  cells = [cell.strip() for cell in lines[3].strip('|').split('|')]
  assert cells[0] == '128' and len(cells) == 1 + 2 * 3
  assert '(' not in cells[1] and '(' not in cells[2]  # the Transformer has no ratio to itself
  assert cells[3].endswith('x)') and cells[4].endswith('x)')
  exponents = rival_benchmark_report.format_exponents(rival_benchmark_report.exponents(tiny_rows))
  assert [line.split('|')[1].strip() for line in exponents.splitlines()[2:]] == [
      'full',
      'linformer',
      'performer',
  ]


def test_ratios_are_speed_up_and_memory_saving_against_the_transformer():
  rows = [
      dict(kind='full', seq_len=1024, steps_per_s=2.0, memory_bytes=600 * 2**20),
      dict(kind='linformer', seq_len=1024, steps_per_s=5.0, memory_bytes=200 * 2**20),
      dict(kind='full', seq_len=2048, steps_per_s=None, memory_bytes=None),
      dict(kind='linformer', seq_len=2048, steps_per_s=3.0, memory_bytes=300 * 2**20),
  ]
  lines = rival_benchmark_report.format_table(rows).splitlines()
  assert lines[2] == '| 1024 | 2.00 | 600.0 | 5.00 (2.5x) | 200.0 (3.0x) |'
  assert lines[3] == '| 2048 | – | – | 3.00 (–) | 300.0 (–) |'  # the Transformer was skipped


@pytest.mark.parametrize('power', [2.0, 1.0, 0.5])
def test_the_exponent_fit_recovers_a_power_law(power):
  seq_lens = [1024, 2048, 4096, 8192, 16384]
  values = [3.0 * n**power for n in seq_lens]
  assert rival_benchmark_report.fit_exponent(seq_lens, values) == pytest.approx(power)
  rows = [
      dict(kind='full', seq_len=n, time_ms=value, memory_bytes=value if n > 1024 else None)
      for n, value in zip(seq_lens, values)
  ]
  fitted = rival_benchmark_report.exponents(rows)['full']
  assert fitted['time_ms'] == pytest.approx(power)
  assert fitted['memory_bytes'] == pytest.approx(power)  # over the n that were measured
  assert fitted['memory_bytes_seq_lens'] == seq_lens[1:]


def test_the_exponent_fit_is_least_squares_and_needs_two_lengths():
  rng = np.random.default_rng(0)
  seq_lens = np.array([1024, 2048, 4096, 8192])
  values = seq_lens**1.5 * np.exp(rng.normal(0, 0.05, 4))
  expected = np.polyfit(np.log(seq_lens), np.log(values), 1)[0]
  assert rival_benchmark_report.fit_exponent(seq_lens, values) == pytest.approx(expected)
  assert rival_benchmark_report.fit_exponent([1024], [5.0]) is None


@pytest.mark.slow
def test_a_cell_over_the_memory_budget_is_compiled_but_not_run():
  settings = RivalBenchmarkSettings(**dict(TINY, memory_budget_bytes=1024))
  row = rival_benchmark.measure_cell(settings, 'full', 64)
  assert row['memory_bytes'] > 1024 and row['time_ms'] is None
  assert row['note'].startswith('cell skipped: needs ')


def test_an_unregistered_kind_is_refused_listing_the_registered_ones():
  with pytest.raises(ConfigError) as error:
    RivalBenchmarkSettings(**dict(TINY, kinds=('linformer', 'no_such_kind')))
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith("--kinds=linformer,no_such_kind is not allowed: 'no_such_kind'")
  assert ', '.join(attention_kinds.REGISTRY.names()) in message


def test_the_transformer_comes_first_and_every_registered_kind_by_default():
  settings = RivalBenchmarkSettings(**dict(TINY, kinds=('performer', 'full')))
  assert settings.measured_kinds() == ('full', 'performer')
  default = RivalBenchmarkSettings(**dict(TINY, kinds=(), kind_settings=()))
  registered = attention_kinds.REGISTRY.names()
  assert default.measured_kinds()[0] == 'full'
  assert sorted(default.measured_kinds()) == sorted(registered)


def test_lra_budgets_apply_where_declared_and_flags_override_them(monkeypatch):
  settings = RivalBenchmarkSettings(**dict(TINY, kind_settings=()))
  assert rival_benchmark.kind_settings(settings, 'performer') == {'performer_features': 256}
  assert rival_benchmark.kind_settings(settings, 'linformer') == {}
  overridden = RivalBenchmarkSettings(**TINY)
  assert rival_benchmark.kind_settings(overridden, 'performer') == {'performer_features': 16}
  assert 'performer performer_features=16' in rival_benchmark.describe_run(overridden)
  monkeypatch.setitem(rival_benchmark.LRA_BUDGETS, 'performer', {'performer_landmarks': 8})
  assert rival_benchmark.unapplied_budgets(('full', 'performer')) == [
      'performer.performer_landmarks'
  ]
  assert "not applied (the kind declares no such setting): ['performer.performer_landmarks']" in (
      rival_benchmark.describe_run(settings)
  )


@pytest.mark.parametrize(
    'kind_setting, message',
    [
        ('performer_features', 'give NAME=VALUE'),
        ('window=4', "no measured kind declares 'window'; they declare performer_features"),
        ('performer_features=0', 'use a positive integer'),
    ],
)
def test_bad_kind_settings_name_their_flag(kind_setting, message):
  with pytest.raises(
      ConfigError, match=f'--kind_settings={kind_setting} is not allowed: .*{message}'
  ):
    RivalBenchmarkSettings(**dict(TINY, kind_settings=(kind_setting,)))


@pytest.mark.slow
def test_the_command_refuses_an_unregistered_kind_in_one_line(run_command):
  result = run_command('rival_benchmark', '--kinds=no_such_kind', timeout=120)
  assert result.returncode == 2
  assert result.stderr.startswith("error: --kinds=no_such_kind is not allowed: 'no_such_kind' ")
  assert result.stderr.count('\n') == 1 and 'linformer' in result.stderr


@pytest.mark.long
def test_a_target_compiles_the_step_for_a_tpu_chip_without_running_it():
  if not (xla_targets.plugin_folder() / 'jax_plugins').is_dir():
    pytest.skip('the XLA plugins are not installed (make xla-targets)')
  env = {**os.environ, 'PYTHONPATH': str(pathlib.Path(__file__).resolve().parents[1])}
  env.pop('JAX_PLATFORMS', None)
  env.pop('XLA_FLAGS', None)  # this suite's XLA:CPU flags are not libtpu's
  flags = ['--target=v5e-1', '--seq_lens=64,128', '--kinds=linformer', '--projected_len=32']
  flags += ['--num_layers=1', '--hidden_dim=16', '--num_heads=2', '--mlp_dim=32']
  result = subprocess.run(
      [sys.executable, '-m', 'linformer_jax.rival_benchmark', *flags],
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith('Target: v5e-1, one device: TPU v5 lite')
  table = [line for line in result.stdout.splitlines() if line.startswith('| 128 |')]
  cells = [cell.strip() for cell in table[0].strip('|').split('|')]
  assert len(cells) == 5 and float(cells[1]) > 0 and cells[4].endswith('x)')
