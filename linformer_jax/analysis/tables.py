"""What every analysis report writes the same way: markdown tables, and numbers
and ratios as text, with one mark for a figure that is missing, CSV files and
the axes of a figure."""

import csv
import math
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

MISSING = '–'  # a figure that was not measured (or cannot be)
_SEPARATORS = {'-': '---', 'r': '---:', 'l': ':---'}


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = '') -> str:
  """A markdown table: the header, then one line per row (cells through str);
  `align` has a character per column, '-' (no alignment), 'r' (right) or 'l'
  (left), '' standing for '-' in every column."""
  align = align or '-' * len(header)
  if len(align) != len(header):
    raise ValueError(f'align={align!r} names {len(align)} columns, the header {len(header)}')
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(_SEPARATORS[a] for a in align) + '|']
  lines += ['| ' + ' | '.join(str(cell) for cell in row) + ' |' for row in rows]
  return '\n'.join(lines)


def number_text(
    value: Optional[float], fmt: str, *, scale: float = 1.0, missing: str = MISSING
) -> str:
  """`value / scale` formatted with `fmt`; `missing` for None, and NaN or inf as
  Python writes them."""
  if value is None:
    return missing
  if not math.isfinite(value):
    return str(value)
  return format(value / scale if scale != 1 else value, fmt)


def ratio_text(numerator: Optional[float], denominator: Optional[float], digits: int = 1) -> str:
  """'2.5x' (numerator / denominator), or MISSING where either is missing or 0."""
  if not numerator or not denominator:
    return MISSING
  return f'{numerator / denominator:.{digits}f}x'


def write_csv(path: str, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
  """A CSV of `rows` with a header of `columns`: each row's value of each
  column, empty where it is None or missing; other keys are left out."""
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    for row in rows:
      writer.writerow({key: '' if row.get(key) is None else row[key] for key in columns})


def new_axes(figsize: Tuple[float, float]) -> Tuple[Any, Any]:
  """A figure and its one axes on a bare Agg canvas: no pyplot, so no global
  backend or open-figure state. Save it with `figure.savefig(path)`."""
  # Imported here: matplotlib takes a second to import, and only plots need it.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  figure = Figure(figsize=figsize)
  FigureCanvasAgg(figure)
  return figure, figure.add_subplot()
