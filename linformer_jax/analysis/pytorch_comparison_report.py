"""The PyTorch comparison's report: its header line, its markdown table and CSV."""

import os
from typing import Any, Dict, Optional, Sequence

from linformer_jax.analysis import tables

# The columns of comparison.csv.
COLUMNS = (
    'seq_len',
    'projected_len',
    'mode',
    'batch',
    'jax_time_ms',
    'jax_time_min_ms',
    'jax_tokens_per_s',
    'torch_time_ms',
    'torch_time_min_ms',
    'torch_tokens_per_s',
    'ratio',
    'jax_version',
    'jax_device',
    'torch_version',
    'linformer_version',
    'torch_device',
    'threads',
)


def _format_rate(tokens_per_s: Optional[float]) -> str:
  return '-' if tokens_per_s is None else f'{tokens_per_s:,.0f}'


def markdown_table(rows: Sequence[Dict[str, Any]], header: str) -> str:
  """The header line and a table n | mode | JAX tokens/s | PyTorch tokens/s | ratio."""
  cells = [
      (
          row['seq_len'],
          row['mode'],
          _format_rate(row['jax_tokens_per_s']),
          _format_rate(row['torch_tokens_per_s']),
          '-' if row['ratio'] is None else f'{row["ratio"]:.2f}x',
      )
      for row in rows
  ]
  table = tables.markdown_table(
      ('n', 'mode', 'JAX tokens/s', 'PyTorch tokens/s', 'ratio'), cells, 'rlrrr'
  )
  return f'{header}\n\n{table}\n'


def write_report(rows: Sequence[Dict[str, Any]], out_dir: str, header: str) -> str:
  """Writes comparison.md and comparison.csv into `out_dir`; returns the markdown."""
  os.makedirs(out_dir, exist_ok=True)
  table = markdown_table(rows, header)
  with open(os.path.join(out_dir, 'comparison.md'), 'w') as f:
    f.write(table)
  tables.write_csv(os.path.join(out_dir, 'comparison.csv'), rows, COLUMNS)
  return table
