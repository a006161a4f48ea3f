"""The report of a sweep: results.md and a figure of the evaluation metric.

A language-model sweep (`task='masked_lm'` or `'causal_lm'`) is judged by validation perplexity,
plotted against steps on a log scale (perplexity.png); a classification sweep
by accuracy, on a linear scale (accuracy.png). Variants that differ only in
`seed` are also summarised together: the mean and sample standard deviation
of the metric over their seeds, one row per group.
"""

import dataclasses
import json
import math
import os
import re
import statistics
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import logging

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.analysis.tables import MISSING
from linformer_jax.analysis.tables import markdown_table
from linformer_jax.analysis.tables import new_axes
from linformer_jax.analysis.tables import number_text
from linformer_jax.training.metric_writers import read_metrics

REPORT_FILE = 'results.md'
FIGURE_FILE = 'perplexity.png'  # language-model sweeps
ACCURACY_FIGURE_FILE = 'accuracy.png'  # classification sweeps
# A language model is off the unigram plateau once its validation perplexity is
# at most this fraction of the unigram model's.
PLATEAU_FRACTION = 0.85


@dataclasses.dataclass(frozen=True)
class _Judged:
  """What a task's sweep reports: the metric, its columns and its figure."""

  metric: str  # the key in eval_results.json and metrics.jsonl
  label: str  # its name in the table and on the figure
  digits: int
  log_scale: bool
  figure: str
  columns: Tuple[Tuple[str, str, int], ...]  # (results key, column name, digits)


_MASKED_LM = _Judged(
    metric='eval_perplexity',
    label='perplexity',
    digits=2,
    log_scale=True,
    figure=FIGURE_FILE,
    columns=(
        ('eval_perplexity', '{split} perplexity', 2),
        ('eval_accuracy', '{split} accuracy', 4),
        ('unigram_perplexity', 'unigram perplexity', 2),
    ),
)
_CLASSIFICATION = _Judged(
    metric='eval_accuracy',
    label='accuracy',
    digits=4,
    log_scale=False,
    figure=ACCURACY_FIGURE_FILE,
    columns=(
        ('eval_accuracy', '{split} accuracy', 4),
        ('eval_loss', '{split} loss', 4),
        ('majority_class_accuracy', 'majority-class accuracy', 4),
    ),
)


def _judged(sweep: Any) -> _Judged:
  return _CLASSIFICATION if sweep.base.get('task') == 'classification' else _MASKED_LM


def figure_file(sweep: Any) -> str:
  """The name of the sweep's figure in its workdir."""
  return _judged(sweep).figure


def results_of(variant_dir: str) -> Optional[Dict[str, Any]]:
  """A variant's eval_results.json, or None before it finished. A file that
  is no JSON object (damaged) is None too, with one warning: the sweep then
  runs the variant's command again, which resumes its finished run and only
  evaluates it, writing the file anew."""
  path = run_folder.RunFolder(variant_dir).results
  if not os.path.exists(path):
    return None
  try:
    results = json.loads(storage.read_text(path))
  except ValueError:
    results = None
  if not isinstance(results, dict):
    logging.warning('%s is damaged (no JSON object): evaluating the variant again.', path)
    return None
  return results


def _all_results(sweep: Any, workdir: str) -> Dict[str, Optional[Dict[str, Any]]]:
  """Each variant's `results_of`, by name, in sweep order."""
  return {v.name: results_of(os.path.join(workdir, v.name)) for v in sweep.variants}


def describe(overrides: Mapping[str, Any]) -> str:
  """'key=value, ...' of a variant's overrides."""
  if not overrides:
    return 'the base config'
  return ', '.join(f'{key}={value!r}' for key, value in overrides.items())


def _eval_split(sweep: Any, workdir: str) -> str:
  """The split the variants were evaluated on (a --set may have changed it)."""
  default = sweep.base.data.eval_split
  finished = [r for r in _all_results(sweep, workdir).values() if r is not None]
  return finished[0].get('eval_split', default) if finished else default


def report_table(sweep: Any, workdir: str) -> str:
  """The markdown table of results.md: one row per variant of the sweep."""
  judged = _judged(sweep)
  split = _eval_split(sweep, workdir)
  names = [name.format(split=split) for _, name, _ in judged.columns]
  rows = []
  for variant in sweep.variants:
    results = results_of(os.path.join(workdir, variant.name))
    if results is None:
      cells = ['not finished'] + [MISSING] * (len(names) + 2)
    else:
      metrics = [number_text(results.get(key), f',.{digits}f') for key, _, digits in judged.columns]
      wall_time = number_text(results['wall_time_s'], ',.0f')
      cells = [results['step'], *metrics, f"{results['parameters']:,}", wall_time]
    rows.append([variant.name, describe(variant.overrides).replace('|', '\\|'), *cells])
  header = ['variant', 'overrides', 'steps', *names, 'parameters', 'wall time (s)']
  return markdown_table(header, rows, align='--r' + 'r' * len(names) + 'rr')


def seed_groups(sweep: Any) -> List[Tuple[str, List[Any]]]:
  """Variants that differ only in `seed`, grouped: (description, variants),
  in sweep order; only groups of two or more."""
  groups: Dict[str, List[Any]] = {}
  for variant in sweep.variants:
    rest = {key: value for key, value in variant.overrides.items() if key != 'seed'}
    groups.setdefault(describe(rest), []).append(variant)
  return [(name, members) for name, members in groups.items() if len(members) > 1]


def seed_table(sweep: Any, workdir: str) -> Optional[str]:
  """Mean ± sample standard deviation of the metric over each seed group's
  finished variants (None when the sweep has no seed groups)."""
  groups = seed_groups(sweep)
  if not groups:
    return None
  judged, results = _judged(sweep), _all_results(sweep, workdir)
  digits = f',.{judged.digits}f'
  rows = []
  for name, members in groups:
    values = [(results[variant.name] or {}).get(judged.metric) for variant in members]
    values = [float(value) for value in values if value is not None]
    cells = [MISSING] * 3  # mean ± std, min, max
    if values:
      spread = statistics.stdev(values) if len(values) > 1 else 0.0
      mean = f'{number_text(statistics.mean(values), digits)} ± {number_text(spread, digits)}'
      cells = [mean, number_text(min(values), digits), number_text(max(values), digits)]
    rows.append([name, f'{len(values)} of {len(members)}', *cells])
  mean_column = f'{_eval_split(sweep, workdir)} {judged.label}: mean ± std'
  header = ['overrides', 'seeds finished', mean_column, 'min', 'max']
  return markdown_table(header, rows, align='-rrrr')


def steps_table(sweep: Any, workdir: str) -> Optional[str]:
  """A language-model sweep's perplexity at each evaluation of each finished variant, and the
  step it left the unigram plateau: its first evaluation at or below PLATEAU_FRACTION x the
  unigram perplexity ('–' if none). None for other sweeps or before any variant finished."""
  if _judged(sweep) is _CLASSIFICATION:
    return None
  results = _all_results(sweep, workdir)
  unigram = {name: (r or {}).get('unigram_perplexity') for name, r in results.items()}
  curves = {name: _curve(workdir, name, _MASKED_LM.metric) for name in unigram if unigram[name]}
  if not curves:
    return None
  steps = sorted(set().union(*curves.values()))
  rows = []
  for name, curve in curves.items():
    limit = PLATEAU_FRACTION * unigram[name]
    left = next((step for step in sorted(curve) if curve[step] <= limit), MISSING)
    rows.append([name, left] + [number_text(curve.get(step), ',.1f') for step in steps])
  header = ['variant', 'left the plateau at step', *map(str, steps)]
  return markdown_table(header, rows, align='-r' + 'r' * len(steps))


def _curve(workdir: str, name: str, metric: str) -> Dict[int, float]:
  """Step -> metric of a variant's evaluations."""
  return {
      m['step']: m[metric]
      for m in read_metrics(os.path.join(workdir, name))
      if math.isfinite(m.get(metric, math.nan))
  }


def _group_label(description: str, members: List[Any]) -> str:
  """A seed group's name: its variants' common name without `-sN`, else its overrides."""
  stems = {re.sub(r'-s\d+$', '', variant.name) for variant in members}
  return stems.pop() if len(stems) == 1 else description


def plot_metric(sweep: Any, workdir: str, path: str, over_seeds: bool = False) -> None:
  """Saves the evaluation metric against steps of every variant or, `over_seeds`, of each
  seed group: the mean over its finished seeds at the steps they share, shaded from min to max."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  judged = _judged(sweep)
  groups = seed_groups(sweep) if over_seeds else [(v.name, [v]) for v in sweep.variants]
  figure, axes = new_axes((6.4, 4.4))
  for description, members in groups:
    curves = [_curve(workdir, variant.name, judged.metric) for variant in members]
    curves = [curve for curve in curves if curve]
    if not curves:
      continue
    label = description
    if over_seeds:
      label = f'{_group_label(description, members)} ({len(curves)} of {len(members)} seeds)'
    steps = sorted(set.intersection(*(set(curve) for curve in curves)))
    values = [[curve[step] for curve in curves] for step in steps]
    means = [statistics.mean(at_step) for at_step in values]
    (line,) = axes.plot(steps, means, marker='o', markersize=3, label=label)
    if len(curves) > 1:
      low, high = [min(v) for v in values], [max(v) for v in values]
      axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
  if judged.log_scale:
    axes.set_yscale('log')
    # Plain numbers (250, not 2.5 x 10^2): curves often span less than a decade.
    axes.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    axes.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
  axes.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  axes.set_xlabel('training step')
  axes.set_ylabel(f'{_eval_split(sweep, workdir)} {judged.label}')
  axes.set_title(sweep.title)
  axes.grid(True, which='both', alpha=0.3)
  if axes.get_lines():
    axes.legend(fontsize='small')
  figure.tight_layout()
  figure.savefig(path, dpi=120)


def write_report(sweep: Any, workdir: str) -> str:
  """Writes workdir/results.md and the figures; returns the table."""
  judged = _judged(sweep)
  table = report_table(sweep, workdir)
  seeds = seed_table(sweep, workdir)
  by_step = steps_table(sweep, workdir)
  seeds_figure = judged.figure.replace('.png', '_over_seeds.png')
  text = (
      f'# {sweep.title}\n\n{table}\n\nMetrics are on the evaluation split at the last step; '
      'wall time is that of the session that finished the run. Evaluation '
      f'{judged.label} against steps: {judged.figure}.\n'
  )
  if by_step:
    text += (
        f'\n## By step\n\n{by_step}\n\nValidation {judged.label} at each evaluation; a run '
        f'left the unigram plateau at the first evaluation at or below {PLATEAU_FRACTION:g} x '
        'the unigram perplexity.\n'
    )
  if seeds:
    text += (
        f'\n## Over seeds\n\n{seeds}\n\nThe mean over seeds against steps, shaded from the '
        f'lowest seed to the highest: {seeds_figure}.\n'
    )
  storage.write_text(os.path.join(workdir, REPORT_FILE), text)
  plot_metric(sweep, workdir, os.path.join(workdir, judged.figure))
  if seeds:
    plot_metric(sweep, workdir, os.path.join(workdir, seeds_figure), over_seeds=True)
  return table
