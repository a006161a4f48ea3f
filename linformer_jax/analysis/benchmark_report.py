"""Output of the whole-model benchmark: results.csv, table.md and the plots.

The rows come from `linformer_jax.benchmark`, one per (model, n, k), keyed by
COLUMNS. table.md follows the Linformer paper's Table 3 (rows n, columns k,
cells 'speed-up / memory saving (saving on temporaries)' of Linformer over the
Transformer at the same n), then lists the measured numbers behind the ratios and a summary of the
matrix-multiply rate, the utilisation at n=4096, k=256 and the skipped cells.
time_per_token.png and memory.png plot time per token and memory against n.
"""

import csv
import os
from typing import Any, Callable, Dict, List, Optional

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# The fields of a row, in the order of results.csv's columns.
COLUMNS = (
    'model',
    'seq_len',
    'projected_len',
    'batch',
    'time_ms',
    'time_min_ms',
    'time_max_ms',
    'temp_bytes',
    'argument_bytes',
    'output_bytes',
    'peak_bytes',
    'tokens_per_s',
    'us_per_token',
    'flops',
    'bytes_accessed',
    'utilisation',
    'train_tokens_per_s',
    'note',
)
# Cell of the summary line: the paper quotes k = 256 at n = 4096.
HEADLINE_CELL = (4096, 256)


def memory_bytes(row: Dict[str, Any]) -> Optional[int]:
  """Temporary + argument bytes of a row, None if it was never compiled."""
  if row['temp_bytes'] is None:
    return None
  return row['temp_bytes'] + row['argument_bytes']


def cell_name(row: Dict[str, Any]) -> str:
  """A row's model, n and (for Linformer) k, e.g. 'linformer n=4096 k=256'."""
  k = f" k={row['projected_len']}" if row['projected_len'] else ''
  return f"{row['model']} n={row['seq_len']}{k}"


def _ratio(numerator, denominator) -> str:
  if numerator is None or denominator is None or not denominator:
    return '–'
  return f'{numerator / denominator:.1f}x'


def _find(rows, model: str, seq_len: int, projected_len: int = 0):
  for row in rows:
    if (row['model'], row['seq_len'], row['projected_len']) == (model, seq_len, projected_len):
      return row
  return None


def format_table(rows: List[Dict[str, Any]]) -> str:
  """Table 3's layout: rows n, columns k, cells 'speed-up / memory saving'.

  The memory saving counts temporaries + arguments (parameters included); the
  bracketed ratio counts the temporaries alone, the part that grows with the
  batch, so it is the saving a large batch approaches.
  """
  seq_lens = sorted({row['seq_len'] for row in rows})
  projected_lens = sorted({row['projected_len'] for row in rows if row['model'] == 'linformer'})
  lines = [
      '| n | ' + ' | '.join(f'k = {k}' for k in projected_lens) + ' |',
      '|---|' + '---|' * len(projected_lens),
  ]
  for seq_len in seq_lens:
    full = _find(rows, 'transformer', seq_len)
    cells = []
    for projected_len in projected_lens:
      linformer = _find(rows, 'linformer', seq_len, projected_len)
      if linformer is None:
        cells.append('–')
        continue
      speed_up = _ratio(full and full['time_ms'], linformer['time_ms'])
      saving = _ratio(full and memory_bytes(full), memory_bytes(linformer))
      activation_saving = _ratio(full and full['temp_bytes'], linformer['temp_bytes'])
      cells.append(f'{speed_up} / {saving} ({activation_saving})')
    lines.append(f'| {seq_len} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _number(value, fmt: str) -> str:
  return '' if value is None else format(value, fmt)


def format_details(rows: List[Dict[str, Any]]) -> str:
  """The measured numbers behind the ratios, one line per cell."""
  lines = [
      '| model | n | k | time ms (min–max) | us/token | temp + args MiB | '
      'GFLOP | utilisation | train tokens/s |',
      '|---|---|---|---|---|---|---|---|---|',
  ]
  for row in rows:
    memory = memory_bytes(row)
    timing = (
        ''
        if row['time_ms'] is None
        else f"{row['time_ms']:.1f} ({row['time_min_ms']:.1f}–{row['time_max_ms']:.1f})"
    )
    lines.append(
        f"| {row['model']} | {row['seq_len']} | {row['projected_len'] or ''} | "
        f"{timing} | {_number(row['us_per_token'], '.1f')} | "
        f"{_number(memory and memory / 2**20, '.1f')} | "
        f"{_number(row['flops'] and row['flops'] / 1e9, '.1f')} | "
        f"{_number(row['utilisation'], '.1%')} | "
        f"{_number(row['train_tokens_per_s'], '.0f')} |"
    )
  return '\n'.join(lines)


def format_summary(rows: List[Dict[str, Any]], matmul_gflops: float) -> str:
  """The matmul rate, utilisation at n=4096, k=256, and the skipped cells."""
  lines = [f'Matrix-multiply rate: {matmul_gflops:.1f} GFLOP/s.']
  seq_len, projected_len = HEADLINE_CELL
  for model, k in (('linformer', projected_len), ('transformer', 0)):
    row = _find(rows, model, seq_len, k)
    if row and row['utilisation'] is not None:
      name = f'Linformer (k={k})' if k else 'Transformer'
      line = f"Utilisation at n={seq_len}, {name}: {row['utilisation']:.1%} of the matmul rate"
      if row['bytes_accessed']:
        line += (
            f"; {row['flops'] / row['bytes_accessed']:.1f} FLOPs per byte "
            'accessed (XLA cost analysis)'
        )
      lines.append(line + '.')
  notes = [f"- {cell_name(row)}: {row['note']}" for row in rows if row['note']]
  if notes:
    lines += ['', 'Skipped or partial cells:'] + notes
  return '\n'.join(lines)


def _plot(rows, value: Callable, ylabel: str, title: str, path: str) -> None:
  # A bare Agg canvas: no pyplot, so no global backend or open-figure state.
  figure = Figure(figsize=(6, 4))
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  series = sorted(
      {(row['model'], row['projected_len']) for row in rows},
      key=lambda s: (s[0] != 'transformer', s[1]),
  )
  for model, projected_len in series:
    points = [
        (row['seq_len'], value(row))
        for row in rows
        if (row['model'], row['projected_len']) == (model, projected_len) and value(row) is not None
    ]
    if points:
      label = 'Transformer' if model == 'transformer' else f'Linformer k={projected_len}'
      axes.plot(*zip(*sorted(points)), marker='o', label=label)
  if axes.lines:
    axes.legend()
  axes.set_xscale('log', base=2)
  axes.set_yscale('log')
  axes.set_xlabel('sequence length n')
  axes.set_ylabel(ylabel)
  axes.set_title(title)
  axes.grid(True, which='both', alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def write_outputs(
    rows: List[Dict[str, Any]], out_dir: str, matmul_gflops: float, header: str = ''
) -> str:
  """Writes results.csv, table.md and the two plots; returns table.md's text."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, 'results.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
      writer.writerow({key: '' if row[key] is None else row[key] for key in COLUMNS})
  text = (
      '\n\n'.join(
          part
          for part in (
              header,
              'Speed-up / memory saving of Linformer over the Transformer at the same n '
              '(memory: compiled temporary + argument bytes; in brackets the saving on '
              'temporaries alone, which a large batch approaches):',
              format_table(rows),
              format_details(rows),
              format_summary(rows, matmul_gflops),
          )
          if part
      )
      + '\n'
  )
  with open(os.path.join(out_dir, 'table.md'), 'w') as f:
    f.write(text)
  _plot(
      rows,
      lambda row: row['us_per_token'],
      'time per token (us)',
      'Inference time per token',
      os.path.join(out_dir, 'time_per_token.png'),
  )
  _plot(
      rows,
      lambda row: memory_bytes(row) and memory_bytes(row) / 2**20,
      'temporary + argument memory (MiB)',
      'Inference memory',
      os.path.join(out_dir, 'memory.png'),
  )
  return text
