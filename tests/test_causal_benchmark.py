"""The causal LM benchmark on a tiny model: rows, cache sizes, FLOPs, outputs, errors.

The library runs in-process; one `slow` test runs `python -m linformer_jax.causal_benchmark`.
"""

import csv
import math
import os

import pytest

from linformer_jax import causal_benchmark
from linformer_jax.causal_benchmark import CausalBenchmarkSettings
from linformer_jax.errors import ConfigError
from linformer_jax.training import compiled_step

TINY = dict(
    contexts=(64, 128),
    seq_lens=(64, 128),
    num_layers=2,
    hidden_dim=32,
    num_heads=2,
    mlp_dim=64,
    block_len=16,
    slots=4,
    repeats=1,
)
MEASURED = (
    'time_ms',
    'time_min_ms',
    'time_max_ms',
    'tokens_per_s',
    'argument_bytes',
    'output_bytes',
    'temp_bytes',
    'flops',
    'flops_per_token',
)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  out_dir = str(tmp_path_factory.mktemp('causal_bench'))
  settings = CausalBenchmarkSettings(**TINY)
  rows = causal_benchmark.run_all(settings)
  table = causal_benchmark.write_outputs(rows, out_dir, causal_benchmark.describe_run(settings))
  with open(os.path.join(out_dir, 'results.csv')) as f:
    csv_rows = list(csv.DictReader(f))
  return rows, csv_rows, out_dir, table


def by_cell(rows):
  return {(r['benchmark'], r['model'], int(r['length'])): r for r in rows}


@pytest.mark.long
def test_the_csv_has_one_measured_row_per_benchmark_model_and_length(run):
  _, csv_rows, _, _ = run
  assert tuple(csv_rows[0]) == causal_benchmark.COLUMNS
  expected = [
      (name, model, length)
      for name in ('generation', 'forward')
      for length in (64, 128)
      for model in ('transformer', 'linformer')
  ]
  assert [tuple(cell) for cell in by_cell(csv_rows)] == expected
  assert len(csv_rows) == len(expected)
  for row in csv_rows:
    assert row['note'] == '', row
    for column in MEASURED:
      value = float(row[column])
      assert math.isfinite(value) and value > 0, (column, row)
    low, median, high = (float(row[c]) for c in ('time_min_ms', 'time_ms', 'time_max_ms'))
    assert low <= median <= high
    tokens = 1 if row['benchmark'] == 'generation' else int(row['length'])
    assert float(row['tokens_per_s']) == pytest.approx(tokens / (median * 1e-3))
    assert float(row['flops_per_token']) == pytest.approx(float(row['flops']) / tokens)
    linformer = row['model'] == 'linformer'
    assert (int(row['block_len']), int(row['slots'])) == ((16, 4) if linformer else (0, 0))
    assert row['device'] and row['dtype'] == 'float32'
    # Only the decode step donates its cache, and XLA writes the new cache into it.
    if row['benchmark'] == 'generation':
      assert row['cache_donated'] == 'True'
      assert int(row['alias_bytes']) == int(row['cache_bytes']) > 0
    else:
      assert row['cache_donated'] == 'False' and row['cache_bytes'] == ''
      assert int(row['alias_bytes']) == 0


def test_the_cache_sizes_are_the_kv_cache_and_the_block_summaries(run):
  cells = by_cell(run[0])
  layers, width, position_bytes = TINY['num_layers'], TINY['hidden_dim'], 4
  for context in (64, 128):
    # Keys and values of every position, float32.
    full = 2 * layers * context * width * 4 + position_bytes
    assert cells['generation', 'transformer', context]['cache_bytes'] == full
    # The current block's keys and values, r summaries per block and their mask.
    slots = context // 16 * 4
    linformer = layers * (2 * 16 * width * 4 + 2 * slots * width * 4 + slots) + position_bytes
    assert cells['generation', 'linformer', context]['cache_bytes'] == linformer
  largest = max(TINY['contexts'])
  assert (
      cells['generation', 'linformer', largest]['cache_bytes']
      < cells['generation', 'transformer', largest]['cache_bytes']
  )


def test_a_linformer_token_costs_fewer_flops_at_a_long_context():
  settings = CausalBenchmarkSettings(**dict(TINY, contexts=(1024,)))
  flops = {
      attention: compiled_step.cost_analysis(
          causal_benchmark.compile_decode(settings, attention, 1024)[0]
      )['flops']
      for attention in ('full', 'linformer')
  }
  assert 0 < flops['linformer'] < 0.75 * flops['full'], flops


def test_table_and_plots_are_written(run):
  rows, _, out_dir, table = run
  with open(os.path.join(out_dir, 'table.md')) as f:
    assert f.read() == table
  assert table.startswith('Device: ')
  cells = by_cell(rows)
  for context in (64, 128):
    full, linformer = (cells['generation', m, context] for m in ('transformer', 'linformer'))
    speed_up = full['time_ms'] / linformer['time_ms']
    saving = full['cache_bytes'] / linformer['cache_bytes']
    generation_table = table.split('Forward:')[0]
    line = next(row for row in generation_table.splitlines() if row.startswith(f'| {context} | '))
    assert f'| {speed_up:.2f}x |' in line and f'| {saving:.2f}x |' in line, line
  for model in ('transformer', 'linformer'):
    first, last = (cells['generation', model, c]['time_ms'] for c in (64, 128))
    assert f'- {model}: {last / first:.2f}x from C=64 to C=128' in table
  full, linformer = (cells['forward', m, 128] for m in ('transformer', 'linformer'))
  line = next(row for row in table.splitlines() if row.startswith('| 128 | all |'))
  assert f"| {full['time_ms'] / linformer['time_ms']:.2f}x |" in line, line
  assert 'Skipped' not in table
  for name in ('generation.png', 'forward.png'):
    path = os.path.join(out_dir, name)
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert os.path.getsize(path) > 1000


def test_cells_that_cannot_run_or_fit_are_skipped_with_a_note(tmp_path):
  settings = CausalBenchmarkSettings(**dict(TINY, contexts=(64, 72), memory_limit_bytes=1))
  skipped = causal_benchmark.generation_cell(settings, 'linformer', 72)
  assert 'block_len=16 does not divide 72' in skipped['note']
  assert skipped['time_ms'] is None and skipped['flops'] is None
  too_big = causal_benchmark.forward_cell(settings, 'linformer', 64, query_blocks=2)
  assert too_big['time_ms'] is None and too_big['temp_bytes'] > 0 and too_big['flops'] > 0
  assert 'skipped' in too_big['note'] and 'limit' in too_big['note']
  assert too_big['query_blocks_per_step'] == 2
  table = causal_benchmark.write_outputs([skipped, too_big], str(tmp_path))
  assert 'generation linformer C=72: skipped' in table
  assert 'forward linformer n=64 query blocks 2: timing skipped' in table


@pytest.mark.parametrize(
    'overrides, flag',
    [
        (dict(contexts=(100,)), '--contexts=100 '),
        (dict(seq_lens=(64, 0)), '--seq_lens=64,0 '),
        (dict(repeats=-1), '--repeats=-1 '),
        (dict(slots=32), '--slots=32 '),
        (dict(slots=3, projection='mean'), '--slots=3 '),
        (dict(num_heads=3), '--hidden_dim=32 '),
        (dict(linformer_query_blocks=(0, -4)), '--linformer_query_blocks=0,-4 '),
        (dict(sharing='everything'), '--sharing=everything '),
        (dict(memory_limit_bytes=0), '--memory_limit_gb=0'),
    ],
)
def test_bad_settings_raise_an_error_naming_the_flag(overrides, flag):
  with pytest.raises(ConfigError, match=f'^{flag}'):
    CausalBenchmarkSettings(**dict(TINY, **overrides))


@pytest.mark.slow
def test_the_command_rejects_bad_flags_in_one_line(tmp_path, run_command):
  tiny_flags = ['--num_layers=1', '--hidden_dim=32', '--num_heads=2', '--mlp_dim=64']
  for bad, message in (
      (['--contexts=100', '--block_len=16'], 'error: --contexts=100 is not allowed: no Linformer'),
      (['--repeats=-1'], 'error: --repeats=-1 is not allowed'),
  ):
    result = run_command('causal_benchmark', f'--out={tmp_path}', *tiny_flags, *bad, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not os.listdir(tmp_path)
