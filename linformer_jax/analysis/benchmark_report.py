"""Output of the whole-model benchmark: results.csv, table.md and the plots.

The rows come from `linformer_jax.benchmark`, one per (model, n, k), keyed by
COLUMNS; the plots show time per token and memory against n. See
docs/benchmarks.md.
"""

import functools
import os
from typing import Any, Callable, Dict, List, Optional

from linformer_jax import storage
from linformer_jax.analysis import tables
from linformer_jax.units import GIB
from linformer_jax.units import MIB

# The fields of a row, in the order of results.csv's columns.
COLUMNS = tuple(
    'model seq_len projected_len batch time_ms time_min_ms time_max_ms temp_bytes argument_bytes '
    'output_bytes peak_bytes tokens_per_s us_per_token flops bytes_accessed utilisation '
    'train_tokens_per_s note budget_batch bytes_per_sequence inference_chunk '
    'attention_kernel'.split()
)
# The models of the grid: the paper's Transformer (one pass, our einsums), the
# memory-efficient one a user would pick (docs/benchmarks.md), and Linformer.
TRANSFORMER = 'transformer'
EFFICIENT_TRANSFORMER = 'transformer-efficient'
LINFORMER = 'linformer'
MODELS = (TRANSFORMER, EFFICIENT_TRANSFORMER, LINFORMER)
# Cell of the summary line: the paper quotes k = 256 at n = 4096.
HEADLINE_CELL = (4096, 256)
# A number of the details table: empty where it was not measured.
_detail = functools.partial(tables.number_text, missing='')


def memory_bytes(row: Dict[str, Any]) -> Optional[int]:
  """Temporary + argument bytes of a row, None if it was never compiled."""
  if row['temp_bytes'] is None:
    return None
  return row['temp_bytes'] + row['argument_bytes']


def cell_name(row: Dict[str, Any]) -> str:
  """A row's model, n and (for Linformer) k, e.g. 'linformer n=4096 k=256'."""
  k = f" k={row['projected_len']}" if row['projected_len'] else ''
  return f"{row['model']} n={row['seq_len']}{k}"


def series_label(model: str, projected_len: int) -> str:
  """A model's name in the plots and the summary, e.g. 'Linformer k=256'."""
  if model == LINFORMER:
    return f'Linformer k={projected_len}'
  return 'Transformer (efficient)' if model == EFFICIENT_TRANSFORMER else 'Transformer'


def _find(rows, model: str, seq_len: int, projected_len: int = 0):
  cell = (model, seq_len, projected_len)
  return next((r for r in rows if (r['model'], r['seq_len'], r['projected_len']) == cell), None)


def _ratios(linformer: Dict[str, Any], full: Optional[Dict[str, Any]], by_budget: bool) -> str:
  """Linformer's 'speed-up / memory saving' over the baseline `full` (None if missing)."""
  speed_up = tables.ratio_text(linformer['tokens_per_s'], full and full['tokens_per_s'])
  if by_budget:
    saving = tables.ratio_text(full and full['bytes_per_sequence'], linformer['bytes_per_sequence'])
    return f'{speed_up} / {saving}'
  saving = tables.ratio_text(full and memory_bytes(full), memory_bytes(linformer))
  activation_saving = tables.ratio_text(full and full['temp_bytes'], linformer['temp_bytes'])
  return f'{speed_up} / {saving} ({activation_saving})'


def format_table(
    rows: List[Dict[str, Any]], baseline: str = TRANSFORMER, by_budget: bool = False
) -> str:
  """Table 3's layout: rows n, columns k, cells 'speed-up / memory saving'.

  Linformer against `baseline`, with the ratios `describe_method` states;
  `by_budget`: the rows ran at their memory-budget batches.
  """
  projected_lens = sorted({row['projected_len'] for row in rows if row['model'] == LINFORMER})
  table_rows = []
  for seq_len in sorted({row['seq_len'] for row in rows}):
    full = _find(rows, baseline, seq_len)
    cells = [seq_len]
    for projected_len in projected_lens:
      linformer = _find(rows, LINFORMER, seq_len, projected_len)
      cells.append(tables.MISSING if linformer is None else _ratios(linformer, full, by_budget))
    table_rows.append(cells)
  return tables.markdown_table(['n'] + [f'k = {k}' for k in projected_lens], table_rows)


def format_details(rows: List[Dict[str, Any]], by_budget: bool = False) -> str:
  """The numbers behind the ratios, one line per cell; `by_budget` adds bytes per sequence."""
  header = (
      'model | n | k | batch | time ms (min–max) | us/token | temp + args MiB | GFLOP | '
      'utilisation | train tokens/s'
  ).split(' | ') + ['MiB/sequence'] * by_budget
  table_rows = []
  for row in rows:
    timing = ''
    if row['time_ms'] is not None:
      timing = f"{row['time_ms']:.1f} ({row['time_min_ms']:.1f}–{row['time_max_ms']:.1f})"
    cells = [row['model'], row['seq_len'], row['projected_len'] or '', _detail(row['batch'], 'd')]
    cells += [
        timing,
        _detail(row['us_per_token'], '.1f'),
        _detail(memory_bytes(row), '.1f', scale=MIB),
        _detail(row['flops'], '.1f', scale=1e9),
        _detail(row['utilisation'], '.1%'),
        _detail(row['train_tokens_per_s'], '.0f'),
    ]
    if by_budget:
      cells.append(_detail(row['bytes_per_sequence'], '.2f', scale=MIB))
    table_rows.append(cells)
  return tables.markdown_table(header, table_rows)


def format_summary(rows: List[Dict[str, Any]], matmul_gflops: float) -> str:
  """The matmul rate, utilisation at n=4096 (Linformer at k=256), skipped cells."""
  lines = [f'Matrix-multiply rate: {matmul_gflops:.1f} GFLOP/s.']
  seq_len, projected_len = HEADLINE_CELL
  for model, k in ((LINFORMER, projected_len), (TRANSFORMER, 0), (EFFICIENT_TRANSFORMER, 0)):
    row = _find(rows, model, seq_len, k)
    if row and row['utilisation'] is not None:
      name = f'Linformer (k={k})' if model == LINFORMER else series_label(model, k)
      line = f"Utilisation at n={seq_len}, {name}: {row['utilisation']:.1%} of the matmul rate"
      if row['bytes_accessed']:
        intensity = row['flops'] / row['bytes_accessed']
        line += f'; {intensity:.1f} FLOPs per byte accessed (XLA cost analysis)'
      lines.append(line + '.')
  notes = [f"- {cell_name(row)}: {row['note']}" for row in rows if row['note']]
  if notes:
    lines += ['', 'Skipped or partial cells:'] + notes
  return '\n'.join(lines)


def _plot(rows, value: Callable, ylabel: str, title: str, path: str) -> None:
  figure, axes = tables.new_axes((6, 4))
  series = sorted(
      {(row['model'], row['projected_len']) for row in rows},
      key=lambda s: (s[0] == LINFORMER, s[0] == EFFICIENT_TRANSFORMER, s[1]),
  )
  for model, projected_len in series:
    points = [
        (row['seq_len'], value(row))
        for row in rows
        if (row['model'], row['projected_len']) == (model, projected_len) and value(row) is not None
    ]
    if points:
      axes.plot(*zip(*sorted(points)), marker='o', label=series_label(model, projected_len))
  if axes.lines:
    axes.legend()
  axes.set_xscale('log', base=2)
  axes.set(yscale='log', xlabel='sequence length n', ylabel=ylabel, title=title)
  axes.grid(True, which='both', alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def describe_method(rows: List[Dict[str, Any]], memory_budget_bytes: Optional[float]) -> str:
  """The sentence above Table 3: how the batches were chosen and the ratios taken."""
  if memory_budget_bytes is None:
    batches = ', '.join(str(b) for b in sorted({r['batch'] for r in rows if r['batch']}))
    return (
        f'Method: a fixed batch of {batches} sequence(s) per forward pass. Speed-up = '
        'ratio of tokens/s; memory saving = ratio of compiled temporary + argument bytes '
        '(in brackets the saving on temporaries alone, which a large batch approaches).'
    )
  return (
      f"Method: the paper's memory budget of {memory_budget_bytes / GIB:g} GiB: each cell "
      'runs at the largest batch whose compiled temporary + argument + output bytes fit it '
      '(the batch column below). Speed-up = ratio of tokens/s at those batches; memory '
      'saving = ratio of bytes per sequence (compiled bytes less the parameters, over the '
      'batch).'
  )


def format_tables(rows: List[Dict[str, Any]], memory_budget_bytes: Optional[float]) -> List[str]:
  """The method, then Table 3 against each Transformer in the rows, each under a caption."""
  baselines = {TRANSFORMER: "Transformer (one pass, einsum attention: the paper's baseline)"}
  efficient = next((row for row in rows if row['model'] == EFFICIENT_TRANSFORMER), None)
  if efficient:
    chunk, kernel = efficient['inference_chunk'], efficient['attention_kernel']
    execution = f'inference chunk {chunk}' if chunk else 'one pass'
    efficient_name = f'memory-efficient Transformer ({execution}, attention kernel {kernel})'
    baselines[EFFICIENT_TRANSFORMER] = efficient_name
  parts = [describe_method(rows, memory_budget_bytes)]
  for baseline, name in baselines.items():
    caption = f'Linformer over the {name} at the same n, speed-up / memory saving:'
    parts += [caption, format_table(rows, baseline, memory_budget_bytes is not None)]
  return parts


def write_outputs(
    rows: List[Dict[str, Any]],
    out_dir: str,
    matmul_gflops: float,
    header: str = '',
    memory_budget_bytes: Optional[float] = None,
) -> str:
  """Writes results.csv, table.md (under `header`) and the two plots into out_dir.

  Returns table.md's text. memory_budget_bytes is the budget the rows' batches
  were found for, None when they ran at a fixed batch.
  """
  by_budget = memory_budget_bytes is not None
  os.makedirs(out_dir, exist_ok=True)
  tables.write_csv(os.path.join(out_dir, 'results.csv'), rows, COLUMNS)
  parts = [
      header,
      *format_tables(rows, memory_budget_bytes),
      format_details(rows, by_budget),
      format_summary(rows, matmul_gflops),
  ]
  text = '\n\n'.join(part for part in parts if part) + '\n'
  storage.write_text(os.path.join(out_dir, 'table.md'), text)
  _plot(
      rows,
      lambda row: row['us_per_token'],
      'time per token (us)',
      'Inference time per token',
      os.path.join(out_dir, 'time_per_token.png'),
  )
  if by_budget:
    memory, memory_label = (lambda row: row['bytes_per_sequence']), 'bytes per sequence (MiB)'
  else:
    memory, memory_label = memory_bytes, 'temporary + argument memory (MiB)'
  _plot(
      rows,
      lambda row: memory(row) and memory(row) / MIB,
      memory_label,
      'Inference memory',
      os.path.join(out_dir, 'memory.png'),
  )
  return text
