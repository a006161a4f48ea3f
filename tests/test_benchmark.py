"""The whole-model benchmark on a tiny grid: rows, memory scaling, outputs, errors.

Also the memory-efficient Transformer row and the paper's max-batch method
(the largest batch within a compiled-memory budget). The grids run
in-process; one `slow` test runs `python -m linformer_jax.benchmark`.
"""

import csv
import dataclasses
import os
import re

import pytest

from linformer_jax import benchmark
from linformer_jax.analysis import benchmark_budget
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis.benchmark_report import EFFICIENT_TRANSFORMER
from linformer_jax.analysis.benchmark_report import LINFORMER
from linformer_jax.analysis.benchmark_report import TRANSFORMER
from linformer_jax.errors import ConfigError
from linformer_jax.training import compiled_step

TINY = dict(
    seq_lens=(64, 128),
    projected_lens=(16, 32),
    num_layers=2,
    hidden_dim=64,
    num_heads=2,
    mlp_dim=128,
    repeats=2,
)
# One small layer at a length where the n x n attention scores dominate the
# Transformer's temporaries, chunked 32 queries at a time.
ATTENTION_BOUND = dict(
    seq_lens=(256,),
    projected_lens=(32,),
    num_layers=1,
    hidden_dim=32,
    num_heads=2,
    mlp_dim=64,
    repeats=1,
    inference_chunk=32,
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
  row = benchmark.benchmark_cell(settings, TRANSFORMER, 64)
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
        (dict(inference_chunk=-1), '--inference_chunk=-1'),
        (dict(attention_kernel='flash'), '--attention_kernel=flash'),
        (dict(attention_kernel='cudnn'), '--attention_kernel=cudnn needs --dtype=bfloat16'),
        (dict(memory_budget_bytes=0), '--memory_budget_gb=0'),
        (
            dict(memory_budget_bytes=16 * 2**30, memory_limit_bytes=19.2 * 2**30),
            r'--memory_budget_gb=16 does not fit this machine: .* use --memory_budget_gb=12.8',
        ),
        (dict(max_batch=0), '--max_batch=0'),
    ],
)
def test_bad_settings_raise_an_error_naming_the_flag(overrides, flag):
  with pytest.raises(ConfigError, match=flag) as error:
    benchmark.BenchmarkSettings(**dict(TINY, **overrides))
  assert '\n' not in str(error.value)


def test_a_chunk_or_kernel_adds_the_efficient_transformer_at_every_n():
  assert [model for model, _, _ in benchmark.grid_cells(benchmark.BenchmarkSettings(**TINY))] == [
      TRANSFORMER,
      LINFORMER,
      LINFORMER,
  ] * 2
  settings = benchmark.BenchmarkSettings(**dict(TINY, inference_chunk=32))
  assert list(benchmark.grid_cells(settings)) == [
      (TRANSFORMER, 64, None),
      (EFFICIENT_TRANSFORMER, 64, None),
      (LINFORMER, 64, 16),
      (LINFORMER, 64, 32),
      (TRANSFORMER, 128, None),
      (EFFICIENT_TRANSFORMER, 128, None),
      (LINFORMER, 128, 16),
      (LINFORMER, 128, 32),
  ]
  for chunk, kernel in ((32, 'einsum'), (0, 'xla'), (32, 'xla')):
    settings = benchmark.BenchmarkSettings(
        **dict(TINY, inference_chunk=chunk, attention_kernel=kernel)
    )
    assert settings.has_efficient_transformer
    execution = {
        model: (config.attention, config.inference_chunk, config.attention_kernel)
        for model, config in (
            (model, settings.model_config(model, 128, k))
            for model, _, k in benchmark.grid_cells(settings)
        )
    }
    assert execution == {
        TRANSFORMER: ('full', 0, 'einsum'),  # the paper's baseline, always
        EFFICIENT_TRANSFORMER: ('full', chunk, kernel),
        LINFORMER: ('linformer', chunk, 'einsum'),
    }
    assert settings.model_config(LINFORMER, 128, 16).projected_len == 16
  description = benchmark.describe_run(settings)
  assert 'inference chunk 32' in description and 'attention kernel xla' in description


@pytest.fixture(scope='module')
def efficient_grid(tmp_path_factory):
  out_dir = str(tmp_path_factory.mktemp('bench_efficient'))
  rows = benchmark.run_grid(benchmark.BenchmarkSettings(**ATTENTION_BOUND), matmul_gflops=1.0)
  return rows, benchmark_report.write_outputs(rows, out_dir, 1.0)


def test_chunks_shrink_the_efficient_transformers_temporaries(efficient_grid):
  cells = by_cell(efficient_grid[0])
  naive, efficient = cells[TRANSFORMER, 256, 0], cells[EFFICIENT_TRANSFORMER, 256, 0]
  assert (naive['inference_chunk'], naive['attention_kernel']) == (0, 'einsum')
  assert (efficient['inference_chunk'], efficient['attention_kernel']) == (32, 'einsum')
  # 2 heads x 256 x 256 float32 scores in one pass, 2 x 32 x 256 per chunk.
  assert efficient['temp_bytes'] < naive['temp_bytes'] / 2
  assert efficient['flops'] == pytest.approx(naive['flops'], rel=0.1)
  assert efficient['time_ms'] > 0 and efficient['note'] == ''


def test_the_table_compares_linformer_with_both_transformers(efficient_grid):
  rows, table = efficient_grid
  assert 'Method: a fixed batch of 1 sequence(s) per forward pass.' in table
  assert 'over the Transformer (one pass, einsum attention' in table
  assert 'over the memory-efficient Transformer (inference chunk 32, attention kernel einsum)' in (
      table
  )
  cells = by_cell(rows)
  linformer = cells[LINFORMER, 256, 32]
  table_lines = [line for line in table.splitlines() if line.startswith('| 256 |')]
  assert len(table_lines) == 2
  for baseline, line in zip((TRANSFORMER, EFFICIENT_TRANSFORMER), table_lines):
    full = cells[baseline, 256, 0]
    speed_up = linformer['tokens_per_s'] / full['tokens_per_s']
    saving = full['temp_bytes'] / linformer['temp_bytes']
    assert re.fullmatch(rf'\| 256 \| {speed_up:.1f}x / \d+\.\dx \({saving:.1f}x\) \|', line)
  at_4096 = [dict(row, seq_len=4096, utilisation=0.5) for row in rows]
  summary = benchmark_report.format_summary(at_4096, 1.0)
  assert 'Utilisation at n=4096, Transformer (efficient): 50.0%' in summary
  assert benchmark_report.series_label(EFFICIENT_TRANSFORMER, 0) == 'Transformer (efficient)'


@pytest.mark.parametrize(
    'largest_fitting, max_batch, expected',
    [(37, 4096, 37), (0, 4096, None), (10**9, 4096, 4096), (10**9, 100, 100), (64, 64, 64)],
)
def test_the_budget_search_finds_the_largest_batch_that_fits(largest_fitting, max_batch, expected):
  tried = []

  def fits(batch):
    tried.append(batch)
    return batch <= largest_fitting

  assert benchmark_budget.largest_fitting_batch(fits, max_batch) == expected
  assert len(tried) == len(set(tried)) <= 2 * max_batch.bit_length()
  assert max(tried) <= max_batch


@pytest.fixture(scope='module')
def budget_grid(tmp_path_factory):
  # The efficient Transformer uses the XLA kernel: no chunk loop to compile.
  settings = benchmark.BenchmarkSettings(
      **dict(
          ATTENTION_BOUND,
          seq_lens=(64,),
          projected_lens=(16,),
          inference_chunk=0,
          attention_kernel='xla',
          max_batch=8,
      )
  )
  batch_of_4 = benchmark_budget.ForwardPass(settings.model_config(TRANSFORMER, 64)).compile(4)
  budget = benchmark_budget.budgeted_bytes(compiled_step.planned_bytes(batch_of_4))
  settings = dataclasses.replace(settings, memory_budget_bytes=budget)
  out_dir = str(tmp_path_factory.mktemp('bench_budget'))
  rows = benchmark.run_grid(settings, matmul_gflops=1.0)
  table = benchmark_report.write_outputs(rows, out_dir, 1.0, memory_budget_bytes=budget)
  return settings, rows, out_dir, table


@pytest.mark.long
def test_each_cell_runs_at_the_largest_batch_within_the_budget(budget_grid):
  settings, rows, out_dir, _ = budget_grid
  budget = settings.memory_budget_bytes
  for row in rows:
    batch = row['budget_batch']
    assert row['batch'] == batch >= 1
    assert benchmark_budget.budgeted_bytes(row) <= budget
    forward = benchmark_budget.ForwardPass(
        settings.model_config(row['model'], 64, row['projected_len'] or None)
    )
    parameters = benchmark_budget.parameter_bytes(forward.abstract_variables)
    assert row['bytes_per_sequence'] == (benchmark_budget.budgeted_bytes(row) - parameters) / batch
    assert row['tokens_per_s'] == pytest.approx(batch * 64 / (row['time_ms'] * 1e-3))
    if batch == settings.max_batch:
      assert '--max_batch=8' in row['note']
  # The budget is the Transformer's compiled bytes at batch 4, so it fits 4
  # and (the largest that fits) not one more.
  transformer = by_cell(rows)[TRANSFORMER, 64, 0]
  assert transformer['budget_batch'] >= 4
  if transformer['budget_batch'] < settings.max_batch:
    forward = benchmark_budget.ForwardPass(settings.model_config(TRANSFORMER, 64))
    one_more = compiled_step.planned_bytes(forward.compile(transformer['budget_batch'] + 1))
    assert benchmark_budget.budgeted_bytes(one_more) > budget
  with open(os.path.join(out_dir, 'results.csv')) as f:
    header = next(csv.reader(f))
  assert header[-4:] == [
      'budget_batch',
      'bytes_per_sequence',
      'inference_chunk',
      'attention_kernel',
  ]


def test_the_budget_table_compares_tokens_per_second_and_bytes_per_sequence(budget_grid):
  settings, rows, _, table = budget_grid
  assert f'memory budget of {settings.memory_budget_bytes / 2**30:g} GiB' in table
  assert 'attention kernel xla) at the same n' in table
  cells = by_cell(rows)
  linformer = cells[LINFORMER, 64, 16]
  table_lines = [line for line in table.splitlines() if line.startswith('| 64 |')]
  assert len(table_lines) == 2
  for baseline, line in zip((TRANSFORMER, EFFICIENT_TRANSFORMER), table_lines):
    full = cells[baseline, 64, 0]
    speed_up = linformer['tokens_per_s'] / full['tokens_per_s']
    saving = full['bytes_per_sequence'] / linformer['bytes_per_sequence']
    assert line == f'| 64 | {speed_up:.1f}x / {saving:.1f}x |'


def test_a_cell_whose_batch_of_one_exceeds_the_budget_is_skipped():
  settings = benchmark.BenchmarkSettings(**dict(ATTENTION_BOUND, memory_budget_bytes=1))
  row = benchmark.benchmark_cell(settings, LINFORMER, 256, 32)
  assert row['time_ms'] is None and row['budget_batch'] is None and row['batch'] == 1
  assert row['temp_bytes'] > 0 and 'batch 1 needs' in row['note'] and 'budget' in row['note']


@pytest.mark.long
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
  result = run_command(
      'benchmark',
      f'--out={out_dir}',
      '--seq_lens=64',
      '--projected_lens=32',
      '--memory_budget_gb=0',
      timeout=120,
  )
  assert result.returncode == 2
  assert result.stderr.startswith('error: --memory_budget_gb=0 is not allowed')
