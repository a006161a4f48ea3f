"""Throughput, memory and restart time of the masked-LM data pipeline at scale.

The library of `python -m linformer_jax.data_benchmark`. For each corpus size:

  corpus    OUT/corpus_<size>MB/: ~1 MiB .txt files of the embedded corpus's
            documents, whole, in a seeded order per file, and validation.txt.
  prepare   `prepare_data` with 1 worker and with all cores (sharing one
            tokenizer): input MiB/s and the peak summed RSS of its processes.
  loader    `pretraining.create_train_iterator` on the shards, for each loader
            setting (grain workers, read threads, prefetch), repeated:
            sequences/s, tokens/s, tokens/s per core and the cores it used
            (`loader_throughput`).
  train     `train` for 2 steps from nothing, then resumed to 4 steps: seconds
            from the resumed process's start to its `step 3/4` line.

Results go to OUT/data_benchmark.json (merged with earlier runs of the same
settings) and OUT/data_benchmark.md; logs to OUT/work_<size>MB/logs.
"""

import copy
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import ml_collections
import numpy as np
import psutil

from linformer_jax.analysis import data_benchmark_report as report
from linformer_jax.analysis import loader_throughput
from linformer_jax.analysis.data_benchmark_report import FIRST_RUN_STEPS
from linformer_jax.analysis.data_benchmark_report import SAMPLE_INTERVAL_S
from linformer_jax.analysis.data_benchmark_report import config_flags
from linformer_jax.analysis.data_benchmark_report import flag_value
from linformer_jax.analysis.settings_flags import setting
from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data.sources import embedded
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_config
from linformer_jax.units import GIB
from linformer_jax.units import MIB

STAGES = ('prepare', 'loader', 'train')
# A training text file ends with the first document that takes it past this size.
FILE_BYTES = MIB
VALIDATION_FILE = 'validation.txt'
CORPUS_MANIFEST = 'corpus.json'
RESULTS_JSON = 'data_benchmark.json'
RESULTS_MD = 'data_benchmark.md'
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
RESUMED_RUN_STEPS = 4
# The commands' exit code for a one-line usage error (cli.USAGE_ERROR_EXIT_CODE;
# libraries do not import the command layer).
USAGE_ERROR_EXIT_CODE = 2


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to measure; invalid values raise a ConfigError naming the flag.

  Each field made with `setting` is also the command's flag of its name, its
  help text the field's description (`settings_flags`). The others come from
  --config: config_path, the config file every command runs with; config, that
  file with config_overrides, the dotted fields the user overrode, applied.
  """

  config_path: str
  config: ml_collections.ConfigDict
  out: str = setting(help_text='Folder of the corpora, runs and results.')
  sizes_mb: Sequence[int] = setting((256, 1024), 'Training corpus sizes, in MiB.')
  config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seq_len: int = setting(0, "Packed sequence length (config.model.max_len); 0 keeps the config's.")
  stages: Sequence[str] = setting(STAGES, 'Stages to run (the corpus is always made).')
  seed: int = setting(0, "Seeds the corpus's document order.")
  loader_batch_size: int = setting(32, 'Sequences per loader batch.')
  loader_seconds: float = setting(10.0, 'Seconds the loader is timed.')
  loader_warmup_batches: int = setting(5, 'Loader batches read before the timing starts.')
  loader_settings: Sequence[str] = setting(
      (),
      'Loader settings timed, WORKERS:THREADS:PREFETCH each (config.data.worker_count, '
      "read_threads, prefetch_buffer); none: the config's.",
  )
  loader_repeats: int = setting(1, 'Timings of each loader setting; the table gives the best.')

  def __post_init__(self):
    object.__setattr__(self, 'sizes_mb', tuple(self.sizes_mb))
    object.__setattr__(self, 'stages', tuple(self.stages))
    object.__setattr__(self, 'seq_len', self.seq_len or self.config.model.max_len)
    # The commands run in the repository root.
    object.__setattr__(self, 'config_path', os.path.abspath(self.config_path))
    if not self.out:
      raise ConfigError('--out is empty; name a folder for the corpora and results.')
    if not self.sizes_mb or min(self.sizes_mb) < 1:
      raise ConfigError(
          f'--sizes_mb={",".join(map(str, self.sizes_mb))} is not allowed: give positive '
          'sizes in MiB, e.g. 256,1024.'
      )
    if not self.stages or set(self.stages) - set(STAGES):
      raise ConfigError(
          f'--stages={",".join(self.stages)} is not allowed: use some of {",".join(STAGES)}.'
      )
    if self.seq_len < 3:
      raise ConfigError(f'--seq_len={self.seq_len} is not allowed: use an int >= 3.')
    object.__setattr__(self, 'loader_settings', tuple(self.loader_settings))
    for text in self.loader_settings:
      loader_throughput.LoaderSetting.parse(text)
    for name in ('loader_batch_size', 'loader_warmup_batches', 'loader_seconds', 'loader_repeats'):
      if not getattr(self, name) > 0:
        raise ConfigError(f'--{name}={getattr(self, name)} is not allowed: use a positive value.')
    # Now, not after an hour of preparation: the model must take seq_len, and so on.
    run_config.settings_of(apply_overrides(self.config, self.train_overrides('', '', 2)))

  def train_overrides(self, corpus_folder: str, workdir: str, total_steps: int) -> Dict[str, Any]:
    """Config overrides of the end-to-end training runs."""
    return {
        **self.config_overrides,
        **corpus_overrides(corpus_folder, self.seq_len),
        'data.prepared_dir': os.path.join(workdir, 'prepared'),
        'data.prepare_workers': 0,
        'data.max_eval_batches': 1,
        'total_steps': total_steps,
        'warmup_steps': min(self.config.warmup_steps, FIRST_RUN_STEPS),
        'eval_every': FIRST_RUN_STEPS,
        'log_every': 1,
    }

  def describe(self) -> Dict[str, Any]:
    """The settings that make results comparable, as JSON values."""
    described = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
    for name in ('out', 'sizes_mb', 'stages', 'config'):
      del described[name]
    described.update(tokenizer=self.config.data.tokenizer, vocab_size=self.config.data.vocab_size)
    return json.loads(json.dumps(described, sort_keys=True, default=flag_value))


def generate_corpus(
    folder: pathlib.Path,
    size_mb: int,
    seed: int = 0,
    documents: Optional[Tuple[Sequence[str], Sequence[str]]] = None,
) -> Dict[str, Any]:
  """Writes (or reuses) a corpus of about `size_mb` MiB of training text.

  Training files train-NNNNN.txt hold whole documents separated by blank lines,
  in the order of a permutation seeded by (seed, file index), about FILE_BYTES
  each; validation.txt holds the validation documents once. Only the documents
  are held in memory, whatever the size. A folder whose manifest matches is
  reused as it is.

  Args:
    folder: where the files go.
    size_mb: MiB of training text.
    seed: seeds the document orders.
    documents: (train, validation) document lists; default the embedded corpus.

  Returns:
    The manifest (also folder/corpus.json): file count and bytes of each split.
  """
  manifest_path = folder / CORPUS_MANIFEST
  wanted = {'size_mb': size_mb, 'seed': seed, 'file_bytes': FILE_BYTES}
  if manifest_path.exists():
    manifest = json.loads(manifest_path.read_text())
    if all(manifest.get(key) == value for key, value in wanted.items()):
      return manifest
  train, validation = documents or (
      embedded.embedded_documents('train'),
      embedded.embedded_documents('validation'),
  )
  encoded = [text.encode('utf-8') for text in train]
  if not encoded or not validation:
    raise ValueError('generate_corpus needs training and validation documents.')
  folder.mkdir(parents=True, exist_ok=True)
  manifest_path.unlink(missing_ok=True)
  for stale in folder.glob('*.txt'):
    stale.unlink()
  train_files, remaining = 0, size_mb * MIB
  while remaining > 0:
    order = np.random.default_rng([seed, train_files]).permutation(len(encoded))
    chosen, size = [], 0
    while size < min(FILE_BYTES, remaining):  # a file larger than all documents repeats them
      for index in order:
        chosen.append(encoded[index])
        size += len(encoded[index]) + 2
        if size >= min(FILE_BYTES, remaining):
          break
    (folder / f'train-{train_files:05d}.txt').write_bytes(b'\n\n'.join(chosen) + b'\n')
    train_files, remaining = train_files + 1, remaining - size
  (folder / VALIDATION_FILE).write_text('\n\n'.join(validation) + '\n', 'utf-8')
  validation_bytes = (folder / VALIDATION_FILE).stat().st_size
  manifest = {
      **wanted,
      'train_files': train_files,
      'train_bytes': sum(path.stat().st_size for path in folder.glob('*.txt')) - validation_bytes,
      'validation_bytes': validation_bytes,
  }
  shards.write_json_atomically(manifest_path, manifest)  # last: marks the corpus complete
  return manifest


def corpus_overrides(folder: str, seq_len: int) -> Dict[str, Any]:
  """Config overrides that read a generated corpus in sequences of seq_len."""
  return {
      'data.source': 'text_files',
      'data.path': str(folder),
      'data.split_files': {'validation': [VALIDATION_FILE]},
      'data.train_split': 'train',
      'data.eval_split': 'validation',
      'model.max_len': seq_len,
  }


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted fields set, as --config.FIELD=VALUE sets them."""
  config = copy.deepcopy(config)
  config.update_from_flattened_dict(dict(overrides))
  return config


def tree_rss(process: psutil.Process) -> int:
  """Resident bytes of a process and all its descendants, summed (pages they
  share count once per process, as `ps` shows them)."""
  return int(loader_throughput.tree_total(process, lambda member: member.memory_info().rss))


def peak_tree_rss(popen: subprocess.Popen, interval_s: float = SAMPLE_INTERVAL_S) -> int:
  """Samples `tree_rss` of a running process every interval_s until it exits;
  returns the largest sum seen, in bytes."""
  process = psutil.Process(popen.pid)
  peak = 0
  while popen.poll() is None:
    peak = max(peak, tree_rss(process))
    time.sleep(interval_s)
  return peak


class Measurement(NamedTuple):
  """What `run_measured` measures of a command."""

  wall_s: float  # from start to exit
  peak_rss_bytes: int  # of the process tree
  marker_s: Optional[float]  # from start to the first line matching the marker


def run_measured(
    arguments: Sequence[str], log_path: pathlib.Path, marker: Optional[str] = None
) -> Measurement:
  """Runs `python ARGUMENTS` in the repository root, its output to log_path.

  Args:
    arguments: the interpreter's arguments, e.g. ['-m', 'linformer_jax.train', ...].
    log_path: gets stdout and stderr of the command.
    marker: a regular expression for `marker_s`.

  Raises:
    ConfigError: the command ended with a usage error (exit code 2).
    RuntimeError: it failed otherwise.
  """
  log_path.parent.mkdir(parents=True, exist_ok=True)
  path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get('PYTHONPATH')]))
  pattern = re.compile(marker) if marker else None
  marker_times: List[float] = []
  start = time.perf_counter()
  popen = subprocess.Popen(
      [sys.executable, *arguments],
      cwd=REPO_ROOT,
      env={**os.environ, 'PYTHONPATH': path},
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
  )

  def copy_output():
    with open(log_path, 'w') as log:
      for line in popen.stdout:
        if pattern and not marker_times and pattern.search(line):
          marker_times.append(time.perf_counter() - start)
        log.write(line)

  reader = threading.Thread(target=copy_output, daemon=True)
  reader.start()
  peak = peak_tree_rss(popen)
  wall_s = time.perf_counter() - start
  reader.join()
  if popen.returncode:
    lines = log_path.read_text().strip().splitlines() or ['(no output)']
    errors = [line[len('error:') :].strip() for line in lines if line.startswith('error:')]
    if popen.returncode == USAGE_ERROR_EXIT_CODE and errors:
      raise ConfigError(f'{arguments[1]}: {errors[-1]}')
    raise RuntimeError(
        f'{" ".join(arguments[:2])} failed with exit code {popen.returncode}: '
        f'{lines[-1]} (log: {log_path})'
    )
  return Measurement(wall_s, peak, marker_times[0] if marker_times else None)


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
    self.corpus = generate_corpus(self.corpus_folder, size_mb, settings.seed)
    self.input_bytes = self.corpus['train_bytes'] + self.corpus['validation_bytes']

  def _prepared_overrides(self, name: str, workers: int = 0) -> Dict[str, Any]:
    return {
        **self.settings.config_overrides,
        **corpus_overrides(str(self.corpus_folder), self.settings.seq_len),
        'data.prepared_dir': str(self.work / f'prepared_n{self.settings.seq_len}_{name}'),
        'data.prepare_workers': workers,
    }

  def _prepare_data(self, name: str, workers: int, *flags: str, log: str = '') -> Measurement:
    """Runs `prepare_data` into the prepared folder `name` (untouched with
    --tokenizer_only), with the shared tokenizer."""
    overrides = self._prepared_overrides(name, workers)
    return run_measured(
        ['-m', 'linformer_jax.prepare_data', f'--workdir={self.tokenizer_dir}']
        + config_flags(self.settings.config_path, overrides)
        + list(flags),
        self.work / 'logs' / f'{log or "prepare_" + name}.log',
    )

  def prepare(self) -> Dict[str, Any]:
    """Trains the shared tokenizer if missing and times a run with nothing
    left to do (the start-up); then prepares both splits afresh with 1 worker
    and with all cores."""
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

  def loader_settings(self) -> List[loader_throughput.LoaderSetting]:
    """The settings timed: --loader_settings, else the config's own."""
    if self.settings.loader_settings:
      return [loader_throughput.LoaderSetting.parse(text) for text in self.settings.loader_settings]
    return [loader_throughput.LoaderSetting.of_config(self.settings.config.data)]

  def loader(self) -> Dict[str, Any]:
    """Loader throughput on the all-cores shards, for each setting; the
    top-level figures are the first setting's best."""
    if 'prepare' not in self.settings.stages:  # finishes or checks an earlier preparation
      self._prepare_data('workers_all', 0)
    data = apply_overrides(self.settings.config, self._prepared_overrides('workers_all')).data
    tokenizer = tokenizer_lib.build_tokenizer(data, str(self.tokenizer_dir), lambda: iter(()))
    signature = prepare.split_signature(data, 'train', tokenizer, self.settings.seq_len)
    prepared = shards.PreparedSplit(prepare.split_folder(data, 'train', signature), signature)
    source = shards.ShardedSequences(prepared, self.settings.seq_len)
    summaries = {}
    for loader_setting in self.loader_settings():
      runs = [
          loader_throughput.loader_throughput(
              source,
              tokenizer,
              batch_size=self.settings.loader_batch_size,
              mask_rate=data.mask_rate,
              seconds=self.settings.loader_seconds,
              warmup_batches=self.settings.loader_warmup_batches,
              setting=loader_setting,
          )
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
    return {
        **{
            measure: first[f'best_{measure}']
            for measure in ('sequences_per_s', 'tokens_per_s', 'tokens_per_core_s')
        },
        'cores_used': first['median_cores_used'],
        'settings': summaries,
    }

  def train(self) -> Dict[str, Any]:
    """A run of 2 steps from nothing, then the same workdir resumed to 4 steps."""
    workdir = self.work / f'train_n{self.settings.seq_len}'
    shutil.rmtree(workdir, ignore_errors=True)
    results = {}
    for name, steps, step in (
        ('first', FIRST_RUN_STEPS, 1),
        ('resumed', RESUMED_RUN_STEPS, FIRST_RUN_STEPS + 1),
    ):
      overrides = self.settings.train_overrides(str(self.corpus_folder), str(workdir), steps)
      log = self.work / 'logs' / f'train_{name}.log'
      measured = run_measured(
          ['-m', 'linformer_jax.train', f'--workdir={workdir}']
          + config_flags(self.settings.config_path, overrides),
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
    for stage in STAGES:
      if stage in settings.stages:
        entry[stage] = getattr(size, stage)()
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
