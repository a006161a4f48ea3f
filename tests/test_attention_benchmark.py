"""The one-attention-call benchmark: its rows, its table and its command line."""

import pytest

from linformer_jax import attention_benchmark
from linformer_jax.attention_benchmark import AttentionBenchmarkSettings
from linformer_jax.errors import ConfigError

TINY = dict(seq_lens=(32, 64), projected_len=48, heads=2, head_dim=8, repeats=2)


def test_both_attentions_are_measured_at_every_length_with_k_at_most_n():
  rows = attention_benchmark.run(AttentionBenchmarkSettings(**TINY))
  assert [(row['n'], row['k']) for row in rows] == [(32, 32), (64, 48)]
  for row in rows:
    assert row['full_ms'] > 0 and row['linformer_ms'] > 0
    assert row['full_temp_mib'] >= 0 and row['linformer_temp_mib'] >= 0
  table = attention_benchmark.format_table(rows).splitlines()
  assert table[0].startswith('| n | k | full ms | linformer ms | speed-up |')
  assert table[3].startswith('| 64 | 48 | ')
  assert len(table) == 2 + len(rows)


@pytest.mark.parametrize(
    'overrides, message',
    [
        (dict(seq_lens=()), '--seq_lens= is not allowed'),
        (dict(seq_lens=(64, 0)), '--seq_lens=64,0 is not allowed'),
        (dict(heads=0), '--heads=0 is not allowed'),
        (dict(dtype='float16'), '--dtype=float16 is not allowed'),
    ],
)
def test_bad_settings_name_their_flag(overrides, message):
  with pytest.raises(ConfigError, match=message):
    AttentionBenchmarkSettings(**dict(TINY, **overrides))


def test_the_command_prints_the_table_and_rejects_bad_flags_in_one_line(run_command):
  result = run_command(
      'attention_benchmark',
      '--seq_lens=32',
      '--projected_len=16',
      '--heads=2',
      '--head_dim=8',
      '--repeats=1',
      timeout=120,
  )
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].endswith(
      'batch=1 heads=2 head_dim=8 dtype=float32, forward only, median of 1 runs'
  )
  assert lines[3].startswith('| 32 | 16 | ')
  result = run_command('attention_benchmark', '--seq_lens=32,x', timeout=120)
  assert result.returncode == 2
  assert result.stderr == 'error: --seq_lens=32,x is not allowed: give comma-separated integers.\n'
