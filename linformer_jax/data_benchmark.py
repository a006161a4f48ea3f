"""Throughput, memory and restart time of the masked-LM data pipeline at scale.

  python -m linformer_jax.data_benchmark --out runs/data_benchmark --sizes_mb=256,1024 \
      --seq_len=512

For each size it writes a corpus (OUT/corpus_<size>MB, reused while its settings
match) and runs --stages: prepare (`prepare_data` with 1 worker and with all cores,
sharing one tokenizer), loader (`loader_throughput` on the shards, per
--loader_settings) and train (`train` for 2 steps from nothing, then resumed to 4:
seconds to its `step 3/4` line). Results go to OUT/data_benchmark.json (merged with
earlier runs of the same settings) and OUT/data_benchmark.md, logs to
OUT/work_<size>MB/logs. The measures and results: docs/benchmarks.md, docs/data.md.
"""

import copy
import dataclasses
import json
import os
import pathlib
import shutil
import sys
from typing import Any, Callable, Dict, Mapping, Sequence

from absl import flags
import ml_collections
from ml_collections import config_flags

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import data_benchmark_corpus
from linformer_jax.analysis import data_benchmark_report as report
from linformer_jax.analysis import loader_throughput
from linformer_jax.analysis.process_memory import Measurement
from linformer_jax.analysis.process_memory import run_measured
from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.data import tokenizer_files
from linformer_jax.errors import ConfigError
from linformer_jax.settings_flags import require
from linformer_jax.settings_flags import setting
from linformer_jax.training import run_config
from linformer_jax.units import GIB
from linformer_jax.units import MIB

STAGES = ('prepare', 'loader', 'train')
RESULTS_JSON = 'data_benchmark.json'
RESULTS_MD = 'data_benchmark.md'
RESUMED_RUN_STEPS = 4


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to measure; invalid values raise a ConfigError naming the flag. Each field made
  with `setting` is also the command's flag of its name; the others come from --config:
  config_path, the file the commands run with, and config, that file with
  config_overrides (the dotted fields the user overrode) applied."""

  config_path: str
  config: ml_collections.ConfigDict
  out: str = setting(help_text='Folder of the corpora, runs and results.')
  sizes_mb: Sequence[int] = setting((256, 1024), 'Training corpus sizes, in MiB.', minimum=1)
  config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seq_len: int = setting(0, "Packed sequence length (config.model.max_len); 0 keeps the config's.")
  stages: Sequence[str] = setting(
      STAGES, 'Stages to run (the corpus is always made).', choices=STAGES
  )
  seed: int = setting(0, "Seeds the corpus's document order.")
  loader_batch_size: int = setting(32, 'Sequences per loader batch.', minimum=1)
  loader_seconds: float = setting(10.0, 'Seconds the loader is timed.')
  loader_warmup_batches: int = setting(
      5, 'Loader batches read before the timing starts.', minimum=1
  )
  loader_settings: Sequence[str] = setting(
      (),
      'Loader settings timed, WORKERS:THREADS:PREFETCH each (config.data.worker_count, '
      "read_threads, prefetch_buffer); none: the config's.",
  )
  loader_repeats: int = setting(
      1, 'Timings of each loader setting; the table gives the best.', minimum=1
  )

  def __post_init__(self):
    settings_flags.check(self)
    object.__setattr__(self, 'seq_len', self.seq_len or self.config.model.max_len)
    # The commands run in the repository root.
    object.__setattr__(self, 'config_path', os.path.abspath(self.config_path))
    if not self.out:
      raise ConfigError('--out is empty; name a folder for the corpora and results.')
    require(self.seq_len >= 3, 'seq_len', self.seq_len, 'use an int >= 3')
    for text in self.loader_settings:
      loader_throughput.LoaderSetting.parse(text)
    require(self.loader_seconds > 0, 'loader_seconds', self.loader_seconds, 'use a positive value')
    # Now, not after an hour of preparation: the model must take seq_len, and so on.
    run_config.RunConfig.from_config(apply_overrides(self.config, self.train_overrides('', '', 2)))

  def data_overrides(self, corpus_folder: str, prepared_dir: str, workers: int) -> Dict[str, Any]:
    """Config overrides that prepare the corpus into prepared_dir with `workers`."""
    return {
        **self.config_overrides,
        **data_benchmark_corpus.corpus_overrides(corpus_folder, self.seq_len),
        'data.prepared_dir': prepared_dir,
        'data.prepare_workers': workers,
    }

  def train_overrides(self, corpus_folder: str, workdir: str, total_steps: int) -> Dict[str, Any]:
    """Config overrides of the end-to-end training runs."""
    return {
        **self.data_overrides(corpus_folder, os.path.join(workdir, 'prepared'), 0),
        'data.max_eval_batches': 1,
        'total_steps': total_steps,
        'warmup_steps': min(self.config.warmup_steps, report.FIRST_RUN_STEPS),
        'eval_every': report.FIRST_RUN_STEPS,
        'log_every': 1,
    }

  def describe(self) -> Dict[str, Any]:
    """The settings that make results comparable, as JSON values."""
    described = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
    for name in ('out', 'sizes_mb', 'stages', 'config'):
      del described[name]
    described.update(tokenizer=self.config.data.tokenizer, vocab_size=self.config.data.vocab_size)
    return json.loads(json.dumps(described, sort_keys=True, default=report.flag_value))


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted fields set, as --config.FIELD=VALUE sets them."""
  config = copy.deepcopy(config)
  config.update_from_flattened_dict(dict(overrides))
  return config


class SizeBenchmark:
  """The stages of one corpus size; their files go to OUT/work_<size>MB/."""

  def __init__(self, settings: Settings, size_mb: int, progress: Callable[[str], None]):
    self.settings = settings
    self.progress = lambda message: progress(f'[{size_mb} MB] {message}')
    out = pathlib.Path(settings.out).resolve()
    self.corpus_folder = out / f'corpus_{size_mb}MB'
    self.work = out / f'work_{size_mb}MB'
    data = settings.config.data
    self.tokenizer_dir = self.work / f'tokenizer_{data.tokenizer}_{data.vocab_size}'
    self.corpus = data_benchmark_corpus.generate_corpus(self.corpus_folder, size_mb, settings.seed)
    self.input_bytes = self.corpus['train_bytes'] + self.corpus['validation_bytes']

  def _prepared_overrides(self, name: str, workers: int = 0) -> Dict[str, Any]:
    prepared_dir = self.work / f'prepared_n{self.settings.seq_len}_{name}'
    return self.settings.data_overrides(str(self.corpus_folder), str(prepared_dir), workers)

  def _prepare_data(self, name: str, workers: int, *flags: str, log: str = '') -> Measurement:
    """Runs `prepare_data` into the prepared folder `name` (untouched with
    --tokenizer_only), with the shared tokenizer."""
    overrides = self._prepared_overrides(name, workers)
    return run_measured(
        ['-m', 'linformer_jax.prepare_data', f'--workdir={self.tokenizer_dir}']
        + report.config_arguments(self.settings.config_path, overrides)
        + list(flags),
        self.work / 'logs' / f'{log or "prepare_" + name}.log',
    )

  def prepare(self) -> Dict[str, Any]:
    """Trains the shared tokenizer if missing and times a run with nothing left to do (the
    start-up); then prepares both splits afresh with 1 worker and with all cores."""
    trained = self._prepare_data('none', 0, '--tokenizer_only', log='tokenizer')
    startup = self._prepare_data('none', 0, '--tokenizer_only', log='startup')
    results: Dict[str, Any] = {'tokenizer_s': trained.wall_s, 'startup_s': startup.wall_s}
    self.progress(f'tokenizer {trained.wall_s:.1f} s; prepare_data start-up {startup.wall_s:.1f} s')
    for name, workers in (('workers1', 1), ('workers_all', 0)):
      folder = pathlib.Path(self._prepared_overrides(name)['data.prepared_dir'])
      shutil.rmtree(folder, ignore_errors=True)
      measured = self._prepare_data(name, workers)
      manifest = shards.read_manifest(folder / 'train' / shards.manifest_name(0, 1))
      results[name] = {
          'workers': workers or os.cpu_count(),
          'wall_s': measured.wall_s,
          'mib_per_s': self.input_bytes / MIB / measured.wall_s,
          'peak_rss_gib': measured.peak_rss_bytes / GIB,
          'train_tokens': manifest['tokens'],
          'train_sequences': manifest['sequences'],
      }
      if name == 'workers1':  # only the all-cores shards are read later; spare the disk
        shutil.rmtree(folder)
      self.progress(
          f'prepare, {name}: {measured.wall_s:.1f} s, {results[name]["mib_per_s"]:.2f} MiB/s, '
          f'peak RSS {results[name]["peak_rss_gib"]:.2f} GiB'
      )
    results['speed_up'] = results['workers1']['wall_s'] / results['workers_all']['wall_s']
    return results

  def loader(self) -> Dict[str, Any]:
    """Loader throughput on the all-cores shards for each --loader_settings (else the
    config's own setting); the top-level figures are the first setting's best."""
    if 'prepare' not in self.settings.stages:  # finishes or checks an earlier preparation
      self._prepare_data('workers_all', 0)
    config = apply_overrides(self.settings.config, self._prepared_overrides('workers_all'))
    data = run_config.RunConfig.from_config(config).data
    tokenizer = tokenizer_files.build_tokenizer(data, str(self.tokenizer_dir), lambda: iter(()))
    signature = prepare.split_signature(data, 'train', tokenizer, self.settings.seq_len)
    prepared = shards.PreparedSplit(prepare.split_folder(data, 'train', signature), signature)
    source = shards.ShardedSequences(prepared, self.settings.seq_len)
    texts = self.settings.loader_settings
    timed = [loader_throughput.LoaderSetting.parse(text) for text in texts] or [
        loader_throughput.LoaderSetting(data.worker_count, data.read_threads, data.prefetch_buffer)
    ]
    timing = dict(
        batch_size=self.settings.loader_batch_size,
        mask_rate=data.mask_rate,
        seconds=self.settings.loader_seconds,
        warmup_batches=self.settings.loader_warmup_batches,
    )
    summaries = {}
    for loader_setting in timed:
      runs = [
          loader_throughput.loader_throughput(source, tokenizer, setting=loader_setting, **timing)
          for _ in range(self.settings.loader_repeats)
      ]
      summary = loader_throughput.summarize(loader_setting, runs)
      summaries[loader_setting.label] = summary
      self.progress(
          f'loader, {loader_setting.describe()}: '
          f'{summary["best_tokens_per_s"]:,.0f} tokens/s best, '
          f'{summary["median_tokens_per_s"]:,.0f} median; '
          f'{summary["best_tokens_per_core_s"]:,.0f} per core best, '
          f'{summary["median_cores_used"]:.2f} cores'
      )
    first = next(iter(summaries.values()))
    measures = ('sequences_per_s', 'tokens_per_s', 'tokens_per_core_s')
    best = {measure: first[f'best_{measure}'] for measure in measures}
    return {**best, 'cores_used': first['median_cores_used'], 'settings': summaries}

  def train(self) -> Dict[str, Any]:
    """A run of 2 steps from nothing, then the same workdir resumed to 4 steps."""
    workdir = self.work / f'train_n{self.settings.seq_len}'
    shutil.rmtree(workdir, ignore_errors=True)
    results = {}
    for name, steps, step in (
        ('first', report.FIRST_RUN_STEPS, 1),
        ('resumed', RESUMED_RUN_STEPS, report.FIRST_RUN_STEPS + 1),
    ):
      overrides = self.settings.train_overrides(str(self.corpus_folder), str(workdir), steps)
      log = self.work / 'logs' / f'train_{name}.log'
      measured = run_measured(
          ['-m', 'linformer_jax.train', f'--workdir={workdir}']
          + report.config_arguments(self.settings.config_path, overrides),
          log,
          marker=rf'^step {step}/{steps}\b',
      )
      if measured.marker_s is None:
        raise RuntimeError(f'The {name} training run printed no `step {step}/{steps}`; see {log}.')
      results[name] = {
          'wall_s': measured.wall_s,
          'first_step_s': measured.marker_s,
          'peak_rss_gib': measured.peak_rss_bytes / GIB,
      }
      self.progress(
          f'train, {name}: {measured.wall_s:.1f} s in all, step {step} after '
          f'{measured.marker_s:.1f} s'
      )
    return results


def run_benchmark(settings: Settings, progress: Callable[[str], None] = print) -> str:
  """Runs the stages for every size; writes the JSON and markdown; returns the table."""
  out = pathlib.Path(settings.out)
  out.mkdir(parents=True, exist_ok=True)
  measured = {}
  for size_mb in settings.sizes_mb:
    size = SizeBenchmark(settings, size_mb, progress)
    entry: Dict[str, Any] = {'corpus': {**size.corpus, 'input_mib': size.input_bytes / MIB}}
    entry.update({stage: getattr(size, stage)() for stage in STAGES if stage in settings.stages})
    measured[str(size_mb)] = entry
  json_path = out / RESULTS_JSON
  previous = json.loads(json_path.read_text()) if json_path.exists() else None
  results = report.merge_results(
      previous, settings.describe(), report.machine_description(), measured
  )
  shards.write_json_atomically(json_path, results)
  table = report.markdown_table(results)
  (out / RESULTS_MD).write_text(table)
  return table


def define_flags() -> None:
  cli.define_config_file_flag('configs/default.py', 'Config the commands run with.')
  settings_flags.define_flags(Settings)


def main(_):
  config_flag = flags.FLAGS['config']
  settings = settings_flags.from_flags(
      Settings,
      config_path=config_flags.get_config_filename(config_flag),
      config=config_flag.value,
      config_overrides=config_flags.get_override_values(config_flag),
  )
  print(run_benchmark(settings, lambda line: print(line, file=sys.stderr)))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
