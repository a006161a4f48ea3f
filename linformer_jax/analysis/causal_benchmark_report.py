"""The causal benchmark's report: its tables (generation, growth, whole sequences),
its plots and its CSV."""

import os
from typing import Any, Dict, List

from linformer_jax import storage
from linformer_jax.analysis import tables
from linformer_jax.analysis.benchmark_report import memory_bytes
from linformer_jax.units import MIB

COLUMNS = tuple(
    'benchmark model length block_len slots query_blocks_per_step batch time_ms time_min_ms '
    'time_max_ms tokens_per_s argument_bytes output_bytes temp_bytes alias_bytes cache_bytes '
    'flops flops_per_token cache_donated dtype device note'.split()
)

# "Flat within 25%": the Linformer's ms/token at the largest C over that at the smallest.
GROWTH_GOAL = 1.25


def cell_name(row: Dict[str, Any]) -> str:
  """E.g. 'generation linformer C=4096' or 'forward linformer n=4096 query blocks 4'."""
  length = 'C' if row['benchmark'] == 'generation' else 'n'
  steps = f" query blocks {row['query_blocks_per_step']}" if row['query_blocks_per_step'] else ''
  return f"{row['benchmark']} {row['model']} {length}={row['length']}{steps}"


def _find(rows, name: str, model: str, length: int, query_blocks: int = 0) -> Dict[str, Any]:
  """The row of one cell; a missing one reads as not measured."""
  fields = ('benchmark', 'model', 'length', 'query_blocks_per_step')
  cell = (name, model, length, query_blocks)
  return next((r for r in rows if tuple(map(r.get, fields)) == cell), dict.fromkeys(COLUMNS))


def format_generation(rows: List[Dict[str, Any]]) -> str:
  """Per context C: ms and tokens/s per step, cache MiB and GFLOP per token, with ratios."""
  body = []
  for context in sorted({r['length'] for r in rows if r['benchmark'] == 'generation'}):
    full, lin = (_find(rows, 'generation', m, context) for m in ('transformer', 'linformer'))
    body.append(
        [str(context)]
        + [tables.number_text(r['time_ms'], '.3f') for r in (full, lin)]
        + [tables.ratio_text(full['time_ms'], lin['time_ms'], 2)]
        + [tables.number_text(r['tokens_per_s'], '.1f') for r in (full, lin)]
        + [tables.number_text(r['cache_bytes'], '.1f', scale=MIB) for r in (full, lin)]
        + [tables.ratio_text(full['cache_bytes'], lin['cache_bytes'], 2)]
        + [tables.number_text(r['flops_per_token'], '.4f', scale=1e9) for r in (full, lin)]
    )
  header = ['C', 'Transformer ms/token', 'Linformer ms/token', 'speed-up']
  header += ['Transformer tokens/s', 'Linformer tokens/s', 'Transformer cache MiB']
  header += ['Linformer cache MiB', 'cache saving', 'Transformer GFLOP/token']
  return tables.markdown_table(header + ['Linformer GFLOP/token'], body)


def format_growth(rows: List[Dict[str, Any]]) -> str:
  """Each model's growth of ms/token from its smallest timed C to its largest, beside
  the Linformer's goal; '' if no model has two."""
  lines = []
  for model in ('transformer', 'linformer'):
    timed = sorted(
        (r['length'], r['time_ms'])
        for r in rows
        if (r['benchmark'], r['model']) == ('generation', model) and r['time_ms']
    )
    if len(timed) > 1:
      (first, first_ms), (last, last_ms) = timed[0], timed[-1]
      lines.append(f'- {model}: {last_ms / first_ms:.2f}x from C={first} to C={last}')
  goal = f'goal for the Linformer: flat within {GROWTH_GOAL - 1:.0%}, at most {GROWTH_GOAL}x'
  return f'Growth of the time per token with C ({goal}):\n' + '\n'.join(lines) if lines else ''


def format_forward(rows: List[Dict[str, Any]]) -> str:
  """Per n and Linformer query blocks per step: times and memory, with ratios."""
  body = []
  for lin in (r for r in rows if (r['benchmark'], r['model']) == ('forward', 'linformer')):
    full = _find(rows, 'forward', 'transformer', lin['length'])
    body.append(
        [str(lin['length']), str(lin['query_blocks_per_step'] or 'all')]
        + [tables.number_text(r['time_ms'], '.1f') for r in (full, lin)]
        + [tables.ratio_text(full['time_ms'], lin['time_ms'], 2)]
        + [tables.number_text(memory_bytes(r), '.1f', scale=MIB) for r in (full, lin)]
        + [tables.ratio_text(memory_bytes(full), memory_bytes(lin), 2)]
        + [tables.ratio_text(full['temp_bytes'], lin['temp_bytes'], 2)]
    )
  header = ['n', 'Linformer query blocks per step', 'Transformer ms', 'Linformer ms', 'speed-up']
  header += ['Transformer MiB', 'Linformer MiB', 'memory saving', 'saving on temporaries']
  return tables.markdown_table(header, body)


def _plot(rows, name: str, xlabel: str, ylabel: str, title: str, out_dir: str) -> None:
  """NAME.png: median time against length, one line per model (and query blocks per step)."""
  figure, axes = tables.new_axes((6, 4))
  rows = [r for r in rows if r['benchmark'] == name and r['time_ms'] is not None]
  for series in sorted({(r['model'], r['query_blocks_per_step']) for r in rows}, reverse=True):
    points = [r for r in rows if (r['model'], r['query_blocks_per_step']) == series]
    label = 'Transformer'
    if series[0] == 'linformer':
      label = f"Linformer b={points[0]['block_len']}, r={points[0]['slots']}"
      label += f', query blocks {series[1]}' if series[1] else ''
    axes.plot(*zip(*sorted((r['length'], r['time_ms']) for r in points)), marker='o', label=label)
  if axes.lines:
    axes.legend()
  axes.set(xlabel=xlabel, ylabel=ylabel, title=title, yscale='log')
  axes.set_xscale('log', base=2)
  axes.grid(True, which='both', alpha=0.3)
  figure.tight_layout()
  figure.savefig(os.path.join(out_dir, f'{name}.png'), dpi=100)


def write_outputs(rows: List[Dict[str, Any]], out_dir: str, header: str = '') -> str:
  """Writes results.csv, table.md, generation.png and forward.png; returns table.md's text."""
  os.makedirs(out_dir, exist_ok=True)
  tables.write_csv(os.path.join(out_dir, 'results.csv'), rows, COLUMNS)
  parts = [header]
  if any(r['benchmark'] == 'generation' for r in rows):
    parts.append(
        'Generation: one decode step at position C - 2 (a token that does not end a block), '
        'one token per sequence; speed-up and cache saving of the Linformer over the Transformer:'
    )
    parts += [format_generation(rows), format_growth(rows)]
  if any(r['benchmark'] == 'forward' for r in rows):
    parts.append(
        'Forward: a full causal pass (logits) over n tokens; memory: compiled temporary + '
        'argument bytes, and the saving on temporaries alone (what a large batch approaches):'
    )
    parts.append(format_forward(rows))
  notes = [f"- {cell_name(r)}: {r['note']}" for r in rows if r['note']]
  parts.append('Skipped or partial cells:\n' + '\n'.join(notes) if notes else '')
  text = '\n\n'.join(part for part in parts if part) + '\n'
  storage.write_text(os.path.join(out_dir, 'table.md'), text)
  _plot(rows, 'generation', 'context C', 'ms per token', 'Generation: time per token', out_dir)
  _plot(rows, 'forward', 'sequence length n', 'forward time (ms)', 'Causal forward pass', out_dir)
  return text
