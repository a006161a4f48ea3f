"""The comparison with the PyTorch `linformer` package, without torch.

The PyTorch side is a subprocess speaking JSON lines; here a stand-in script
plays it, so the protocol, the errors, the report and one tiny JAX measurement
are checked in-process. One `slow` test runs the real script where an
interpreter with torch exists, and one runs the command.
"""

import csv
import os
import sys

import pytest

from linformer_jax import pytorch_comparison
from linformer_jax.errors import ConfigError
from linformer_jax.pytorch_comparison import ComparisonSettings
from linformer_jax.pytorch_comparison import TorchBaselineError

TINY = dict(
    seq_lens=(16, 64), projected_len=16, num_layers=1, hidden_dim=32, num_heads=2, repeats=1
)
# A stand-in for experiments/pytorch_linformer_baseline.py: it takes the same
# flags and prints a row per (n, mode) at 2 ms a run, after a line that is not
# a row (as a library's notice on stdout would be).
FAKE_TORCH_SCRIPT = """
import argparse
import json

parser = argparse.ArgumentParser()
for flag in ('seq_lens', 'projected_len', 'num_layers', 'hidden_dim', 'num_heads', 'batch',
             'repeats', 'threads', 'modes', 'device'):
  parser.add_argument('--' + flag)
args = parser.parse_args()
print('a notice that is not a row')
for n in map(int, args.seq_lens.split(',')):
  for mode in args.modes.split(','):
    print(json.dumps({
        'seq_len': n, 'projected_len': int(args.projected_len), 'mode': mode,
        'batch': int(args.batch), 'time_ms': 2.0, 'time_min_ms': 1.5,
        'tokens_per_s': int(args.batch) * n / 2e-3, 'torch_version': 'fake',
        'linformer_version': '0.2.3', 'threads': int(args.threads), 'device': args.device,
    }))
"""
# The interpreter of `make torch-baseline`, for the slow test (skipped without it).
TORCH_PYTHONS = ('.venv-torch/bin/python',)


@pytest.fixture
def fake_torch_script(tmp_path):
  path = tmp_path / 'fake_torch_baseline.py'
  path.write_text(FAKE_TORCH_SCRIPT)
  return path


def failing_script(tmp_path, body):
  path = tmp_path / 'failing_torch_baseline.py'
  path.write_text(body)
  return path


def report_row(seq_len, mode, jax_tokens_per_s, torch_tokens_per_s):
  return {
      'seq_len': seq_len,
      'projected_len': 256,
      'mode': mode,
      'batch': 1,
      'jax_tokens_per_s': jax_tokens_per_s,
      'torch_tokens_per_s': torch_tokens_per_s,
      'ratio': pytorch_comparison._ratio(jax_tokens_per_s, torch_tokens_per_s),
  }


def test_the_report_gives_ratios_of_jax_over_pytorch_in_markdown_and_csv(tmp_path):
  rows = [
      report_row(512, 'forward', 30000.0, 10000.0),
      report_row(512, 'train', 5000.0, 10000.0),
  ]
  table = pytorch_comparison.write_report(rows, str(tmp_path), 'Devices and settings.')

  assert (tmp_path / 'comparison.md').read_text() == table
  lines = table.splitlines()
  assert lines[0] == 'Devices and settings.'
  assert '| n | mode | JAX tokens/s | PyTorch tokens/s | ratio |' in lines
  assert '| 512 | forward | 30,000 | 10,000 | 3.00x |' in lines
  assert '| 512 | train | 5,000 | 10,000 | 0.50x |' in lines
  with open(tmp_path / 'comparison.csv') as f:
    written = list(csv.DictReader(f))
  assert list(written[0]) == list(pytorch_comparison.COLUMNS)
  assert [(r['mode'], float(r['ratio'])) for r in written] == [('forward', 3.0), ('train', 0.5)]
  assert written[0]['jax_time_ms'] == ''  # not in the row: an empty cell, not 'None'


def test_the_torch_rows_come_back_as_the_script_printed_them(fake_torch_script):
  settings = ComparisonSettings(**{**TINY, 'batch': 2, 'threads': 3})
  rows = pytorch_comparison.run_torch_baseline(
      settings, [64, 128], sys.executable, device='cpu', script=fake_torch_script
  )

  assert [(row['seq_len'], row['mode']) for row in rows] == [
      (64, 'forward'),
      (64, 'train'),
      (128, 'forward'),
      (128, 'train'),
  ]
  # The flags reached the script: k, batch, threads and device are echoed back.
  assert {(r['projected_len'], r['batch'], r['threads'], r['device']) for r in rows} == {
      (16, 2, 3, 'cpu')
  }
  assert rows[-1]['tokens_per_s'] == pytest.approx(2 * 128 / 2e-3)


def test_a_failing_script_raises_with_the_end_of_its_stderr(tmp_path):
  script = failing_script(
      tmp_path,
      'import sys\nprint("early line", file=sys.stderr)\n'
      'sys.exit("RuntimeError: CUDA out of memory")\n',
  )
  with pytest.raises(TorchBaselineError, match='exit code 1') as caught:
    pytorch_comparison.run_torch_baseline(
        ComparisonSettings(**TINY), [64], sys.executable, script=script
    )
  assert 'RuntimeError: CUDA out of memory' in str(caught.value)


def test_a_script_missing_rows_raises_naming_them(tmp_path):
  script = failing_script(tmp_path, 'print("{}")\n')
  with pytest.raises(TorchBaselineError, match=r"no row for \(n, mode\) \[\(64, 'forward'\)"):
    pytorch_comparison.run_torch_baseline(
        ComparisonSettings(**TINY), [64], sys.executable, script=script
    )


def test_a_missing_interpreter_is_a_one_line_error_naming_make_torch_baseline(tmp_path):
  missing = str(tmp_path / 'no-venv' / 'bin' / 'python')
  with pytest.raises(ConfigError, match='make torch-baseline') as caught:
    pytorch_comparison.run_torch_baseline(ComparisonSettings(**TINY), [64], missing)
  assert '\n' not in str(caught.value)
  assert f'--torch_python={missing}' in str(caught.value)


@pytest.mark.parametrize(
    'override, flag',
    [
        (dict(seq_lens=(16, 32), projected_len=32), '--projected_len=32'),
        (dict(repeats=0), '--repeats=0'),
        (dict(threads=0), '--threads=0'),
        (dict(hidden_dim=33), '--hidden_dim=33'),
        (dict(modes=('forward', 'backward')), '--modes=forward,backward'),
        (dict(modes=()), '--modes='),
        (dict(seq_lens=()), '--seq_lens='),
    ],
)
def test_bad_settings_raise_a_config_error_naming_the_flag(override, flag):
  with pytest.raises(ConfigError, match=flag):
    ComparisonSettings(**{**TINY, **override})


def test_only_lengths_above_k_are_measured_and_the_model_matches_linformer():
  settings = ComparisonSettings(**TINY)
  assert settings.measured_seq_lens == (64,)
  config = settings.model_config(64)
  assert (config.sharing, config.pre_layer_norm, config.mlp_dim) == ('headwise', True, 128)
  assert (config.max_len, config.projected_len, config.dropout_rate) == (64, 16, 0.0)


def test_compare_times_jax_and_pytorch_side_by_side(fake_torch_script):
  settings = ComparisonSettings(**TINY)
  progress = []
  rows = pytorch_comparison.compare(
      settings, sys.executable, progress=progress.append, script=fake_torch_script
  )

  assert progress == rows
  assert [(row['seq_len'], row['mode']) for row in rows] == [(64, 'forward'), (64, 'train')]
  for row in rows:
    assert row['jax_tokens_per_s'] > 0
    assert row['jax_tokens_per_s'] == pytest.approx(64 / (row['jax_time_ms'] * 1e-3))
    assert row['jax_time_min_ms'] <= row['jax_time_ms']
    assert row['torch_tokens_per_s'] == pytest.approx(64 / 2e-3)
    assert row['ratio'] == pytest.approx(row['jax_tokens_per_s'] / row['torch_tokens_per_s'])
    assert row['torch_device'] == 'cpu'
  header = pytorch_comparison.describe_run(settings, rows)
  assert 'PyTorch fake with linformer 0.2.3 on cpu' in header
  assert 'k=16' in header


@pytest.mark.slow
def test_the_real_pytorch_script_at_a_tiny_size(repo_root):
  torch_python = next(
      (path for path in TORCH_PYTHONS if os.path.isfile(os.path.join(repo_root, path))), None
  )
  if torch_python is None:
    pytest.skip('no interpreter with torch; run `make torch-baseline`')
  settings = ComparisonSettings(**{**TINY, 'threads': 1})
  rows = pytorch_comparison.run_torch_baseline(
      settings, [64], os.path.join(repo_root, torch_python)
  )
  assert [(row['seq_len'], row['mode']) for row in rows] == [(64, 'forward'), (64, 'train')]
  assert all(row['tokens_per_s'] > 0 and row['linformer_version'] == '0.2.3' for row in rows)


@pytest.mark.slow
def test_the_command_ends_with_one_line_without_an_interpreter(run_command, tmp_path):
  result = run_command(
      'pytorch_comparison', f'--out={tmp_path / "out"}', f'--torch_python={tmp_path / "none"}'
  )
  assert result.returncode == 2
  assert result.stderr.strip().count('\n') == 0
  assert 'make torch-baseline' in result.stderr
  assert not (tmp_path / 'out').exists()
