"""The tables of `linformer_jax.rival_benchmark`: per n a group of columns per
attention kind with its ratio to the Transformer, and each kind's fitted
exponents of time, memory or FLOPs in n (docs/benchmarks.md, "Rivals side by
side")."""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from linformer_jax.analysis import tables
from linformer_jax.units import MIB

# The baseline every ratio is taken against, measured first.
TRANSFORMER = 'full'


def fit_exponent(seq_lens: Sequence[float], values: Sequence[float]) -> Optional[float]:
  """p of value ~ n^p: the least-squares slope of log(value) against log(n);
  None with fewer than two distinct n."""
  if len(set(seq_lens)) < 2:
    return None
  slope, _ = np.polyfit(np.log(seq_lens), np.log(values), 1)
  return float(slope)


class Quantity(NamedTuple):
  """A quantity of the table: a row's field, its column label and format."""

  field: str
  label: str
  fmt: str
  scale: float
  higher_is_better: bool  # its ratio is the kind's over the Transformer's, else the inverse


# What the table shows of a run on this host, and of a step compiled for a target.
RUN_QUANTITIES = (
    Quantity('steps_per_s', 'steps/s', '.2f', 1.0, True),
    Quantity('memory_bytes', 'MiB', ',.1f', MIB, False),
)
TARGET_QUANTITIES = (
    Quantity('memory_per_sequence', 'MiB/seq', ',.1f', MIB, False),
    Quantity('flops_per_sequence', 'GFLOP/seq', ',.1f', 1e9, False),
)
# The fields whose exponent in n is fitted, of a run and of a target.
RUN_FITS = ('time_ms', 'memory_bytes')
TARGET_FITS = ('memory_bytes', 'flops')


def exponents(
    rows: List[Dict[str, Any]], fields: Sequence[str] = RUN_FITS
) -> Dict[str, Dict[str, Any]]:
  """Per kind, the fitted exponent of each field over the n where it was measured
  (field -> p, or None), and those n (field_seq_lens)."""
  fitted = {}
  for name in dict.fromkeys(row['kind'] for row in rows):
    own = [row for row in rows if row['kind'] == name]
    fitted[name] = {}
    for field in fields:
      measured = [(row['seq_len'], row[field]) for row in own if row[field]]
      fitted[name][field] = fit_exponent(*zip(*measured)) if measured else None
      fitted[name][f'{field}_seq_lens'] = [n for n, _ in measured]
  return fitted


def _cell(rows_by_key, name: str, seq_len: int, quantity: Quantity) -> str:
  """'12.3 (2.1x)': the kind's value and its ratio to the Transformer's at the
  same n, above 1 where the kind is faster or smaller; the Transformer's alone."""
  row, base = rows_by_key.get((name, seq_len)), rows_by_key.get((TRANSFORMER, seq_len))
  value = row[quantity.field] if row else None
  text = tables.number_text(value, quantity.fmt, scale=quantity.scale)
  if name == TRANSFORMER or value is None:
    return text
  baseline = base[quantity.field] if base else None
  if quantity.higher_is_better:
    return f'{text} ({tables.ratio_text(value, baseline)})'
  return f'{text} ({tables.ratio_text(baseline, value)})'


def format_table(
    rows: List[Dict[str, Any]], quantities: Sequence[Quantity] = RUN_QUANTITIES
) -> str:
  """One row per n and a group of columns per kind, one column per quantity."""
  kinds = list(dict.fromkeys(row['kind'] for row in rows))
  seq_lens = list(dict.fromkeys(row['seq_len'] for row in rows))
  by_key = {(row['kind'], row['seq_len']): row for row in rows}
  header = ['n'] + [f'{name} {quantity.label}' for name in kinds for quantity in quantities]
  table_rows = [
      [seq_len]
      + [_cell(by_key, name, seq_len, quantity) for name in kinds for quantity in quantities]
      for seq_len in seq_lens
  ]
  return tables.markdown_table(header, table_rows, align='r' * len(header))


_FIT_LABELS = {'time_ms': 'time', 'memory_bytes': 'memory', 'flops': 'FLOPs'}


def _exponent_text(fit: Dict[str, Any], field: str) -> str:
  """'1.93 (n 1024-16384)': the exponent and the n it was fitted over."""
  if fit[field] is None:
    return tables.MISSING
  seq_lens = fit[f'{field}_seq_lens']
  return f'{fit[field]:.2f} (n {seq_lens[0]}-{seq_lens[-1]})'


def format_exponents(fitted: Dict[str, Dict[str, Any]], fields: Sequence[str] = RUN_FITS) -> str:
  """The fitted exponents as a table: per kind, p of each field ~ n^p."""
  header = ['kind'] + [f'{_FIT_LABELS[field]} ~ n^p: p' for field in fields]
  rows = [[name] + [_exponent_text(fit, field) for field in fields] for name, fit in fitted.items()]
  return tables.markdown_table(header, rows, align='l' + 'r' * len(fields))


def kernels_text(rows: List[Dict[str, Any]]) -> str:
  """'Attention kernels: full cudnn; linformer einsum': what 'auto' took per kind."""
  kernels = {}
  for row in rows:
    if row['attention_kernel']:
      kernels.setdefault(row['kind'], {})[row['attention_kernel']] = None
  parts = [f'{name} {"/".join(found)}' for name, found in kernels.items()]
  return f'Attention kernels: {"; ".join(parts) or tables.MISSING}.'


def notes(rows: List[Dict[str, Any]]) -> List[str]:
  """'kind n=N: note' of each row that has one."""
  return [f"{row['kind']} n={row['seq_len']}: {row['note']}" for row in rows if row['note']]
