"""The whole-model benchmark on a tiny grid: rows, memory scaling, outputs, errors.

The grid runs in-process; one `slow` test runs `python -m linformer_jax.benchmark`.
"""

import csv
import os
import re

import pytest

from linformer_jax.analysis import benchmark
from linformer_jax.analysis import benchmark_report
from linformer_jax.errors import ConfigError

TINY = dict(
    seq_lens=(64, 128),
    projected_lens=(16, 32),
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    mlp_dim=128,
    repeats=2,
)
TINY_FLAGS = [
    '--num_layers=2',
    '--hidden_dim=64',
    '--num_heads=2',
    '--mlp_dim=128',
    '--repeats=2',
    '--matmul_sizes=128,256',
]


def read_csv(out_dir):
  with open(os.path.join(out_dir, 'results.csv')) as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope='module')
def grid(tmp_path_factory):
  out_dir = str(tmp_path_factory.mktemp('bench'))
  matmul_gflops = benchmark.measure_matmul_gflops(sizes=(256,), repeats=2)
  rows = benchmark.run_grid(benchmark.BenchmarkSettings(**TINY), matmul_gflops)
  table = benchmark_report.write_outputs(rows, out_dir, matmul_gflops)
  return rows, out_dir, table


def by_cell(rows):
  return {(row['model'], int(row['seq_len']), int(row['projected_len'])): row for row in rows}


def test_the_csv_has_one_measured_row_per_model_n_and_k(grid):
  _, out_dir, _ = grid
  rows = read_csv(out_dir)
  assert set(benchmark_report.COLUMNS) <= set(rows[0])
  assert sorted(by_cell(rows)) == sorted(
      [
          ('transformer', 64, 0),
          ('transformer', 128, 0),
          ('linformer', 64, 16),
          ('linformer', 64, 32),
          ('linformer', 128, 16),
          ('linformer', 128, 32),
      ]
  )
  assert len(rows) == 6
  for row in rows:
    assert row['note'] == ''
    low, median, high = (float(row[c]) for c in ('time_min_ms', 'time_ms', 'time_max_ms'))
    assert 0 < low <= median <= high
    assert float(row['tokens_per_s']) == pytest.approx(int(row['seq_len']) / (median * 1e-3))
    assert float(row['us_per_token']) == pytest.approx(median * 1e3 / int(row['seq_len']))
    assert float(row['flops']) > 0 and float(row['utilisation']) > 0
    assert float(row['bytes_accessed']) > 0
    assert int(row['temp_bytes']) > 0 and int(row['argument_bytes']) > 0
    assert row['peak_bytes'] == ''  # The CPU backend reports no peak.


def test_full_attention_memory_grows_faster_with_n_than_linformers(grid):
  cells = by_cell(grid[0])
  full_ratio = (
      cells['transformer', 128, 0]['temp_bytes'] / cells['transformer', 64, 0]['temp_bytes']
  )
  for k in (16, 32):
    linformer_ratio = (
        cells['linformer', 128, k]['temp_bytes'] / cells['linformer', 64, k]['temp_bytes']
    )
    assert full_ratio > linformer_ratio
  # The n x n scores dominate the Transformer's growth; the FLOPs follow too.
  assert full_ratio > 3
  assert cells['transformer', 128, 0]['flops'] > cells['linformer', 128, 16]['flops']


def test_table_and_plots_are_written(grid):
  rows, out_dir, table = grid
  with open(os.path.join(out_dir, 'table.md')) as f:
    assert f.read() == table
  assert '| n | k = 16 | k = 32 |' in table
  for n in (64, 128):
    line = next(row for row in table.splitlines() if row.startswith(f'| {n} |'))
    assert len(re.findall(r'\d+\.\dx / \d+\.\dx', line)) == 2, line
  cells = by_cell(rows)
  full = cells['transformer', 128, 0]
  linformer = cells['linformer', 128, 16]
  saving = benchmark_report.memory_bytes(full) / benchmark_report.memory_bytes(linformer)
  activation_saving = full['temp_bytes'] / linformer['temp_bytes']
  assert f'/ {saving:.1f}x ({activation_saving:.1f}x)' in table
  assert 'Matrix-multiply rate:' in table
  for name in ('time_per_token.png', 'memory.png'):
    path = os.path.join(out_dir, name)
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert os.path.getsize(path) > 1000


def test_a_cell_over_the_memory_limit_is_skipped_with_a_note(tmp_path):
  settings = benchmark.BenchmarkSettings(**dict(TINY, memory_limit_bytes=1))
  row = benchmark.benchmark_cell(settings, 'full', 64)
  assert row['time_ms'] is None and row['temp_bytes'] > 0
  assert 'skipped' in row['note'] and 'limit' in row['note']
  table = benchmark_report.write_outputs([row], str(tmp_path), 1.0)
  assert 'Skipped or partial cells' in table and 'transformer n=64' in table


def test_train_throughput_is_measured_when_asked():
  settings = benchmark.BenchmarkSettings(
      **dict(TINY, num_layers=1, repeats=1, train_throughput=True)
  )
  row = benchmark.benchmark_cell(settings, 'linformer', 64, 16)
  assert row['train_tokens_per_s'] > 0 and row['note'] == ''


@pytest.mark.parametrize(
    'overrides, flag',
    [
        (dict(projected_lens=(128, 256)), '--projected_lens'),
        (dict(seq_lens=(64, 0)), '--seq_lens'),
        (dict(repeats=0), '--repeats'),
        (dict(batch=-1), '--batch'),
        (dict(num_heads=3), '--hidden_dim'),
        (dict(memory_limit_bytes=0), '--memory_limit_gb'),
    ],
)
def test_bad_settings_raise_an_error_naming_the_flag(overrides, flag):
  with pytest.raises(ConfigError, match=flag):
    benchmark.BenchmarkSettings(**dict(TINY, **overrides))


@pytest.mark.slow
def test_the_command_line_skips_what_does_not_fit_and_rejects_bad_flags(
    grid, tmp_path, run_command
):
  # A limit between the Linformer's and the Transformer's bytes at n = 128.
  cells = by_cell(grid[0])
  limit = (
      benchmark_report.memory_bytes(cells['transformer', 128, 0])
      + benchmark_report.memory_bytes(cells['linformer', 128, 32])
  ) / 2
  out_dir = str(tmp_path / 'cli')
  result = run_command(
      'benchmark',
      f'--out={out_dir}',
      '--seq_lens=64,128',
      '--projected_lens=32',
      f'--memory_limit_gb={limit / 2**30}',
      *TINY_FLAGS,
      timeout=120,
  )
  assert result.returncode == 0, result.stderr
  assert '| n | k = 32 |' in result.stdout
  rows = by_cell(read_csv(out_dir))
  assert len(rows) == 4
  assert 'skipped' in rows['transformer', 128, 0]['note']
  assert rows['transformer', 128, 0]['time_ms'] == ''
  assert float(rows['linformer', 128, 32]['time_ms']) > 0
  assert re.search(r'\| 128 \| – / \d+\.\dx \(\d+\.\dx\) \|', result.stdout)

  result = run_command(
      'benchmark', f'--out={out_dir}', '--seq_lens=64', '--projected_lens=64,128', timeout=120
  )
  assert result.returncode == 2
  assert result.stderr.startswith('error: --projected_lens=64,128')
  result = run_command(
      'benchmark',
      f'--out={out_dir}',
      '--seq_lens=64',
      '--projected_lens=32',
      '--matmul_sizes=256,0',
      timeout=120,
  )
  assert result.returncode == 2
  assert result.stderr.startswith('error: --matmul_sizes=256,0')
