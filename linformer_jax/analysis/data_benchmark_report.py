"""The report of the data benchmark: the machine, a markdown table, merged runs."""

import os
import pathlib
import platform
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import ml_collections
import psutil

from linformer_jax.analysis import tables
from linformer_jax.analysis.loader_throughput import LoaderSetting
from linformer_jax.analysis.process_memory import SAMPLE_INTERVAL_S
from linformer_jax.units import GIB

# Steps of the run from nothing, then of the same workdir resumed.
FIRST_RUN_STEPS = 2


def flag_value(value: Any) -> str:
  if isinstance(value, str):
    return value
  return repr(value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value)


def config_arguments(config_path: str, overrides: Mapping[str, Any]) -> List[str]:
  """--config and --config.FIELD=VALUE arguments that give `overrides`."""
  return ['--config', config_path] + [
      f'--config.{key}={flag_value(value)}' for key, value in overrides.items()
  ]


def machine_description() -> Dict[str, Any]:
  """CPU count and model, total RAM and platform."""
  cpuinfo = pathlib.Path('/proc/cpuinfo')
  text = cpuinfo.read_text() if cpuinfo.exists() else ''
  names = re.findall(r'^model name\s*: (.*)$', text, re.M)
  return {
      'cpus': os.cpu_count(),
      'physical_cpus': psutil.cpu_count(logical=False),
      'ram_gib': psutil.virtual_memory().total / GIB,
      'cpu_model': names[0] if names else platform.processor(),
      'platform': platform.platform(),
  }


# (row label, path in a size's entry, format)
TABLE_ROWS = (
    ('input text, MiB (train + validation)', 'corpus.input_mib', '{:,.1f}'),
    ('prepare, 1 worker: MiB/s', 'prepare.workers1.mib_per_s', '{:.2f}'),
    ('prepare, all cores: MiB/s', 'prepare.workers_all.mib_per_s', '{:.2f}'),
    ('prepare speed-up, all cores / 1 worker', 'prepare.speed_up', '{:.2f}x'),
    ('prepare, 1 worker: peak RSS, GiB', 'prepare.workers1.peak_rss_gib', '{:.2f}'),
    ('prepare, all cores: peak RSS, GiB', 'prepare.workers_all.peak_rss_gib', '{:.2f}'),
    ('prepare_data start-up, s', 'prepare.startup_s', '{:.1f}'),
    ('loader: masked sequences/s', 'loader.sequences_per_s', '{:,.0f}'),
    ('loader: tokens/s', 'loader.tokens_per_s', '{:,.0f}'),
    ('loader: tokens/s per core', 'loader.tokens_per_core_s', '{:,.0f}'),
    ('loader: cores used', 'loader.cores_used', '{:.2f}'),
    (f'end to end, {FIRST_RUN_STEPS} steps from nothing, s', 'train.first.wall_s', '{:.1f}'),
    (
        f'restart: s to step {FIRST_RUN_STEPS + 1} when resumed',
        'train.resumed.first_step_s',
        '{:.1f}',
    ),
)

# The rows of each loader setting: (measure, format of the setting's summary).
SETTING_ROWS = (
    ('M tokens/s, best / median', '{best_tokens_per_s} / {median_tokens_per_s}'),
    ('M tokens/s per core, best / median', '{best_tokens_per_core_s} / {median_tokens_per_core_s}'),
    ('cores used', '{median_cores_used:.2f}'),
)


def _loader_rows(sizes: Mapping[str, Any]) -> List[Tuple[str, str, str]]:
  """SETTING_ROWS for each loader setting timed at any size."""
  settings: Dict[str, Mapping[str, Any]] = {}
  for entry in sizes.values():
    settings.update(entry.get('loader', {}).get('settings', {}))
  rows = []
  for label in settings:
    name = f'loader, {LoaderSetting.parse(label).describe()}'
    rows += [(f'{name}: {what}', f'loader.settings.{label}', form) for what, form in SETTING_ROWS]
  return rows


def _cell(entry: Mapping[str, Any], path: str, template: str) -> str:
  for key in path.split('.'):
    if not isinstance(entry, Mapping) or entry.get(key) is None:
      return tables.MISSING
    entry = entry[key]
  if isinstance(entry, Mapping):  # a loader setting's summary, rates in millions
    millions = {key: f'{value / 1e6:.2f}' for key, value in entry.items() if key.endswith('_s')}
    return template.format(**{**entry, **millions})
  return template.format(entry)


def markdown_table(results: Mapping[str, Any]) -> str:
  """The report: a header line, then a row per measure and a column per size."""
  machine, settings = results['machine'], results['settings']
  flags = config_arguments(settings['config_path'], settings['config_overrides'])
  header = (
      f'Machine: {machine["cpus"]} CPUs ({machine["physical_cpus"]} physical, '
      f'{machine["cpu_model"]}), {machine["ram_gib"]:.1f} GiB RAM. Settings: {" ".join(flags)}, '
      f'seq_len {settings["seq_len"]}, tokenizer {settings["tokenizer"]} '
      f'({settings["vocab_size"]}), loader batch {settings["loader_batch_size"]} for '
      f'{settings["loader_seconds"]:g} s, {settings.get("loader_repeats", 1)} times a setting. '
      'Preparation rates are input MiB over the whole '
      "prepare_data command's wall time (start-up included); peak RSS sums the command and "
      f'its workers, sampled every {SAMPLE_INTERVAL_S * 1e3:.0f} ms. Loader tokens are '
      'positions of masked batches; per core, over the CPU seconds (user + system) of the '
      "loader's process tree: the main process, its threads and grain's workers; cores "
      'used: those CPU seconds over the wall time. The loader rows without a setting give '
      "the first setting's best timing."
  )
  sizes = sorted(results['sizes'], key=int)
  body = [
      [label] + [_cell(results['sizes'][size], path, template) for size in sizes]
      for label, path, template in (*TABLE_ROWS, *_loader_rows(results['sizes']))
  ]
  columns = ['measure'] + [f'{size} MB' for size in sizes]
  table = tables.markdown_table(columns, body, '-' + 'r' * len(sizes))
  return f'{header}\n\n{table}\n'


def merge_results(
    previous: Optional[Mapping[str, Any]],
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    measured: Mapping[str, Mapping[str, Any]],
) -> Dict[str, Any]:
  """New measurements over those of an earlier run with the same settings and
  CPU count (its other sizes and stages are kept; any other run is dropped)."""
  same = (
      previous
      and previous.get('settings') == settings
      and previous.get('machine', {}).get('cpus') == machine['cpus']
  )
  sizes = {size: dict(entry) for size, entry in previous['sizes'].items()} if same else {}
  for size, entry in measured.items():
    sizes.setdefault(size, {}).update(entry)
  return {'machine': dict(machine), 'settings': dict(settings), 'sizes': sizes}
