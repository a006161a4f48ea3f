"""The PyTorch comparison's report: its header line, its markdown table and CSV."""

import os
from typing import Any, Dict, Sequence

from linformer_jax.analysis import tables

# Each side's measures, the columns jax_* and torch_*.
MEASURES = ('time_ms', 'time_min_ms', 'tokens_per_s')
# The columns of comparison.csv.
COLUMNS = (
    'seq_len',
    'projected_len',
    'mode',
    'batch',
    *(f'{side}_{measure}' for side in ('jax', 'torch') for measure in MEASURES),
    'ratio',
    'jax_version',
    'jax_device',
    'torch_version',
    'linformer_version',
    'torch_device',
    'threads',
)


def markdown_table(rows: Sequence[Dict[str, Any]], header: str) -> str:
  """The header line and a table n | mode | JAX tokens/s | PyTorch tokens/s | ratio."""
  cells = [
      (
          row['seq_len'],
          row['mode'],
          tables.number_text(row['jax_tokens_per_s'], ',.0f', missing='-'),
          tables.number_text(row['torch_tokens_per_s'], ',.0f', missing='-'),
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
