"""Throughput, memory and restart time of the masked-LM data pipeline at scale.

The library of `python -m linformer_jax.data_benchmark`. For each corpus size:

  corpus    OUT/corpus_<size>MB/: ~1 MiB .txt files of English (the embedded
            corpus's documents, whole, in a seeded order per file) and one
            validation.txt; kept and reused once complete.
  prepare   `python -m linformer_jax.prepare_data` on a fresh prepared_dir with
            1 worker and with all cores (the tokenizer, trained once per size by
            a `--tokenizer_only` run, is shared): MiB/s of input text over the
            command's wall time, and the peak summed RSS of its process tree.
  loader    `masked_lm.create_train_iterator` with masking on the prepared
            shards, in this process: sequences/s and tokens/s after a warm-up.
  train     `python -m linformer_jax.train` for 2 steps from nothing (tokenizer,
            preparation, compilation, 2 steps, evaluation, checkpoint), then the
            same workdir resumed to 4 steps: seconds from the resumed process's
            start to its `step 3/4` progress line.

Results go to OUT/data_benchmark.json (merged with the sizes of earlier runs
of the same settings) and OUT/data_benchmark.md, a table with a column per size.
"""

import copy
import dataclasses
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import ml_collections
import numpy as np
import psutil

from linformer_jax.data import corpus
from linformer_jax.data import masked_lm
from linformer_jax.data import prepare
from linformer_jax.data import shards
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_config

STAGES = ('prepare', 'loader', 'train')
# Each training text file stops at the first document boundary past this size.
FILE_BYTES = 2**20
VALIDATION_FILE = 'validation.txt'
CORPUS_MANIFEST = 'corpus.json'
SAMPLE_INTERVAL_S = 0.05
RESULTS_JSON = 'data_benchmark.json'
RESULTS_MD = 'data_benchmark.md'
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# Steps of the run from nothing, then of the same workdir resumed.
FIRST_RUN_STEPS = 2
RESUMED_RUN_STEPS = 4
_GIB = 2**30
_MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to measure; invalid values raise a ConfigError naming the flag.

  Attributes:
    out: folder of the corpora, runs and results.
    sizes_mb: training corpus sizes in MiB.
    config_path: the config file the commands run with.
    config: that config with `config_overrides` applied.
    config_overrides: dotted fields the user overrode; passed on to every command.
    seq_len: prepared sequence length (model.max_len); 0 keeps the config's.
    stages: which of STAGES to run.
    seed: seeds the corpus's document order.
    loader_batch_size: sequences per loader batch.
    loader_seconds: how long the loader is timed (after the warm-up).
    loader_warmup_batches: batches read before the timing starts.
  """

  out: str
  sizes_mb: Sequence[int]
  config_path: str
  config: ml_collections.ConfigDict
  config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seq_len: int = 0
  stages: Sequence[str] = STAGES
  seed: int = 0
  loader_batch_size: int = 32
  loader_seconds: float = 10.0
  loader_warmup_batches: int = 5

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
    unknown = sorted(set(self.stages) - set(STAGES))
    if unknown or not self.stages:
      raise ConfigError(
          f'--stages={",".join(self.stages)} is not allowed: use some of {",".join(STAGES)}.'
      )
    if self.seq_len < 3:
      raise ConfigError(f'--seq_len={self.seq_len} is not allowed: use an int >= 3.')
    for name in ('loader_batch_size', 'loader_warmup_batches', 'loader_seconds'):
      if not getattr(self, name) > 0:
        raise ConfigError(f'--{name}={getattr(self, name)} is not allowed: use a positive value.')
    # The training runs' config, checked now rather than after an hour of preparation.
    run_config.validate(apply_overrides(self.config, self.train_overrides('.', 'x', 2)))

  def train_overrides(self, corpus_folder: str, workdir: str, total_steps: int) -> Dict[str, Any]:
    """Overrides of the end-to-end training runs."""
    return {
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
    return json.loads(
        json.dumps(
            {
                'config': self.config_path,
                'config_overrides': dict(self.config_overrides),
                'seq_len': self.seq_len,
                'seed': self.seed,
                'tokenizer': self.config.data.tokenizer,
                'vocab_size': self.config.data.vocab_size,
                'loader_batch_size': self.loader_batch_size,
                'loader_seconds': self.loader_seconds,
                'loader_warmup_batches': self.loader_warmup_batches,
            },
            sort_keys=True,
        )
    )


# ---------------------------------------------------------------- corpus


def generate_corpus(
    folder: pathlib.Path, size_mb: int, seed: int = 0, documents: Optional[Sequence[str]] = None
) -> Dict[str, Any]:
  """Writes (or reuses) a corpus of about `size_mb` MiB of training text.

  Training files train-NNNNN.txt hold whole documents, separated by blank lines,
  in the order of a permutation seeded by (seed, file index), up to about
  FILE_BYTES each; validation.txt holds the validation documents once. Only the
  documents are held in memory, whatever the size. A folder whose manifest
  matches is reused as it is.

  Args:
    folder: where the files go.
    size_mb: MiB of training text.
    seed: seeds the document orders.
    documents: (train, validation) document lists; default the embedded corpus.

  Returns:
    The manifest (also folder/corpus.json): files and bytes of each split.
  """
  manifest_path = folder / CORPUS_MANIFEST
  wanted = {'size_mb': size_mb, 'seed': seed, 'file_bytes': FILE_BYTES}
  if manifest_path.exists():
    manifest = json.loads(manifest_path.read_text())
    if all(manifest.get(key) == value for key, value in wanted.items()):
      return manifest
  train_documents, validation_documents = documents or (
      corpus.embedded_documents('train'),
      corpus.embedded_documents('validation'),
  )
  encoded = [text.encode('utf-8') for text in train_documents]
  if not encoded or not validation_documents:
    raise ConfigError('The documents to build the benchmark corpus from are empty.')
  folder.mkdir(parents=True, exist_ok=True)
  manifest_path.unlink(missing_ok=True)
  for stale in folder.glob('*.txt'):
    stale.unlink()
  files, remaining = [], size_mb * _MIB
  while remaining > 0:
    target = min(FILE_BYTES, remaining)
    order = np.random.default_rng([seed, len(files)]).permutation(len(encoded))
    chosen, size = [], 0
    while size < target:  # a file larger than all the documents repeats them
      for index in order:
        chosen.append(encoded[index])
        size += len(encoded[index]) + 2
        if size >= target:
          break
    name = f'train-{len(files):05d}.txt'
    (folder / name).write_bytes(b'\n\n'.join(chosen) + b'\n')
    files.append(name)
    remaining -= size
  (folder / VALIDATION_FILE).write_text('\n\n'.join(validation_documents) + '\n', 'utf-8')
  manifest = {
      **wanted,
      'train_files': len(files),
      'train_bytes': sum((folder / name).stat().st_size for name in files),
      'validation_bytes': (folder / VALIDATION_FILE).stat().st_size,
  }
  shards.write_json_atomically(manifest_path, manifest)  # last: marks the corpus complete
  return manifest


def corpus_overrides(folder: str, seq_len: int) -> Dict[str, Any]:
  """Config overrides that read a generated corpus at seq_len."""
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
  """A copy of `config` with dotted fields set (as --config.FIELD=VALUE would)."""
  config = copy.deepcopy(config)
  for key, value in overrides.items():
    *groups, name = key.split('.')
    node = config
    for group in groups:
      node = node[group]
    node[name] = value
  return config


def _flag_value(value: Any) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  return repr(value)


def config_flags(config_path: str, overrides: Mapping[str, Any]) -> List[str]:
  """--config and --config.FIELD=VALUE arguments that give `overrides`."""
  return ['--config', config_path] + [
      f'--config.{key}={_flag_value(value)}' for key, value in overrides.items()
  ]


# ---------------------------------------------------------------- measuring commands


def tree_rss(process: psutil.Process) -> int:
  """Resident bytes of a process and all its descendants (shared pages count
  once per process, as `ps` shows them)."""
  total = 0
  try:
    members = [process, *process.children(recursive=True)]
  except (psutil.NoSuchProcess, psutil.AccessDenied):
    return 0
  for member in members:
    try:
      total += member.memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      pass  # exited between listing and reading
  return total


def peak_tree_rss(popen: subprocess.Popen, interval_s: float = SAMPLE_INTERVAL_S) -> int:
  """Samples `tree_rss` of a running process every interval_s until it exits;
  returns the largest sum seen (bytes)."""
  process = psutil.Process(popen.pid)
  peak = 0
  while popen.poll() is None:
    peak = max(peak, tree_rss(process))
    time.sleep(interval_s)
  return peak


@dataclasses.dataclass
class Measurement:
  """One command's wall time, peak tree RSS and time to a marker line."""

  wall_s: float
  peak_rss_bytes: int
  marker_s: Optional[float] = None


def run_measured(
    arguments: Sequence[str], log_path: pathlib.Path, marker: Optional[str] = None
) -> Measurement:
  """Runs `python ARGUMENTS` in the repository root, its output to log_path.

  Args:
    arguments: the interpreter's arguments, e.g. ['-m', 'linformer_jax.train', ...].
    log_path: stdout and stderr of the command.
    marker: a regular expression; `marker_s` is the time from the start to the
      first output line matching it.

  Raises:
    ConfigError: the command ended with a usage error (exit code 2).
    RuntimeError: it failed otherwise.
  """
  log_path.parent.mkdir(parents=True, exist_ok=True)
  env = {
      **os.environ,
      'PYTHONPATH': os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get('PYTHONPATH')])),
  }
  pattern = re.compile(marker) if marker else None
  marker_time: List[float] = []
  start = time.perf_counter()
  popen = subprocess.Popen(
      [sys.executable, *arguments],
      cwd=REPO_ROOT,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
  )

  def copy_output():
    with open(log_path, 'w') as log:
      for line in popen.stdout:
        if pattern and not marker_time and pattern.search(line):
          marker_time.append(time.perf_counter() - start)
        log.write(line)

  reader = threading.Thread(target=copy_output, daemon=True)
  reader.start()
  peak = peak_tree_rss(popen)
  wall_s = time.perf_counter() - start
  reader.join()
  if popen.returncode:
    lines = log_path.read_text().strip().splitlines() or ['(no output)']
    errors = [line for line in lines if line.startswith('error:')]
    if popen.returncode == 2 and errors:
      raise ConfigError(f'{arguments[1]}: {errors[-1][len("error:"):].strip()}')
    raise RuntimeError(
        f'{" ".join(arguments[:2])} failed with exit code {popen.returncode}: '
        f'{lines[-1]} (log: {log_path})'
    )
  return Measurement(wall_s, peak, marker_time[0] if marker_time else None)


# ---------------------------------------------------------------- stages


def loader_throughput(
    source,
    tokenizer: tokenizer_lib.Tokenizer,
    *,
    batch_size: int = 32,
    mask_rate: float = 0.15,
    seconds: float = 10.0,
    warmup_batches: int = 5,
    seed: int = 0,
) -> Dict[str, float]:
  """Masked training batches per second of `create_train_iterator` here.

  Args:
    source: packed sequences [num, seq_len]: an array or a grain source
      (`shards.ShardedSequences`).
    tokenizer: the split's tokenizer (special ids, vocabulary size).
    batch_size, mask_rate, seed: as the training run passes them.
    seconds: batches are read for at least this long after the warm-up.
    warmup_batches: batches read before the clock starts.

  Returns:
    sequences_per_s, tokens_per_s (positions, padding included), batches, seconds.
  """
  iterator = masked_lm.create_train_iterator(
      source, batch_size=batch_size, seed=seed, mask_rate=mask_rate, tokenizer=tokenizer
  )
  for _ in range(warmup_batches):
    next(iterator)
  batches, positions = 0, 0
  start = time.perf_counter()
  while batches == 0 or time.perf_counter() - start < seconds:
    positions += next(iterator)['inputs'].size
    batches += 1
  elapsed = time.perf_counter() - start
  return {
      'sequences_per_s': batches * batch_size / elapsed,
      'tokens_per_s': positions / elapsed,
      'batches': batches,
      'seconds': elapsed,
  }


class SizeBenchmark:
  """The stages of one corpus size, in OUT/work_<size>MB/."""

  def __init__(self, settings: Settings, size_mb: int, progress: Callable[[str], None]):
    self.settings = settings
    self.size_mb = size_mb
    self.progress = lambda message: progress(f'[{size_mb} MB] {message}')
    out = pathlib.Path(settings.out).resolve()
    self.corpus_folder = out / f'corpus_{size_mb}MB'
    self.work = out / f'work_{size_mb}MB'
    data = settings.config.data
    self.tokenizer_dir = self.work / f'tokenizer_{data.tokenizer}_{data.vocab_size}'
    self.corpus = generate_corpus(self.corpus_folder, size_mb, settings.seed)
    self.input_bytes = self.corpus['train_bytes'] + self.corpus['validation_bytes']

  def _overrides(self, **extra: Any) -> Dict[str, Any]:
    return {
        **self.settings.config_overrides,
        **corpus_overrides(str(self.corpus_folder), self.settings.seq_len),
        **extra,
    }

  def _prepared_folder(self, name: str) -> pathlib.Path:
    return self.work / f'prepared_n{self.settings.seq_len}_{name}'

  def _prepare_data(self, name: str, workers: int, *extra: str, log: str = '') -> Measurement:
    """Times `prepare_data` into the prepared folder `name` (none is written
    with --tokenizer_only)."""
    overrides = self._overrides(
        **{
            'data.prepared_dir': str(self._prepared_folder(name)),
            'data.prepare_workers': workers,
        }
    )
    return run_measured(
        [
            '-m',
            'linformer_jax.prepare_data',
            f'--workdir={self.tokenizer_dir}',
            *config_flags(self.settings.config_path, overrides),
            *extra,
        ],
        self.work / 'logs' / f'{log or "prepare_" + name}.log',
    )

  def tokenizer(self) -> Dict[str, float]:
    """Trains the shared tokenizer if missing; times that and a start-up run
    (the command with nothing to do: imports, config, tokenizer loading)."""
    existed = (self.tokenizer_dir / tokenizer_lib.MODEL_FILENAME).exists()
    trained = self._prepare_data('none', 0, '--tokenizer_only', log='tokenizer')
    startup = self._prepare_data('none', 0, '--tokenizer_only', log='startup')
    self.progress(
        f'tokenizer: {trained.wall_s:.1f} s; prepare_data start-up {startup.wall_s:.1f} s'
    )
    return {
        'tokenizer_s': trained.wall_s,
        'tokenizer_trained': not existed and self.settings.config.data.tokenizer != 'byte',
        'startup_s': startup.wall_s,
    }

  def prepare(self) -> Dict[str, Any]:
    """Prepares the splits afresh with 1 worker, then all cores."""
    results: Dict[str, Any] = self.tokenizer()
    for name, workers in (('workers1', 1), ('workers_all', 0)):
      shutil.rmtree(self._prepared_folder(name), ignore_errors=True)
      measured = self._prepare_data(name, workers)
      manifest = shards.read_manifest(
          self._prepared_folder(name) / 'train' / shards.manifest_name(0, 1)
      )
      results[name] = {
          'wall_s': measured.wall_s,
          'mib_per_s': self.input_bytes / _MIB / measured.wall_s,
          'peak_rss_gib': measured.peak_rss_bytes / _GIB,
          'train_tokens': manifest['tokens'],
          'train_sequences': manifest['sequences'],
      }
      self.progress(
          f'prepare, {name}: {measured.wall_s:.1f} s, '
          f'{results[name]["mib_per_s"]:.2f} MiB/s, peak RSS '
          f'{results[name]["peak_rss_gib"]:.2f} GiB'
      )
    results['workers_all']['count'] = os.cpu_count()
    results['speed_up'] = results['workers1']['wall_s'] / results['workers_all']['wall_s']
    return results

  def loader(self) -> Dict[str, Any]:
    """Loader throughput on the all-cores shards (prepared first if missing)."""
    config = apply_overrides(
        self.settings.config,
        self._overrides(**{'data.prepared_dir': str(self._prepared_folder('workers_all'))}),
    )
    if 'prepare' not in self.settings.stages:  # finishes or checks an earlier preparation
      self._prepare_data('workers_all', 0)
    tokenizer = tokenizer_lib.build_tokenizer(
        config.data, str(self.tokenizer_dir), lambda: iter(())
    )
    prepared = self._prepared_split(config, tokenizer)
    source = shards.ShardedSequences(prepared, self.settings.seq_len)
    results = loader_throughput(
        source,
        tokenizer,
        batch_size=self.settings.loader_batch_size,
        mask_rate=config.data.mask_rate,
        seconds=self.settings.loader_seconds,
        warmup_batches=self.settings.loader_warmup_batches,
    )
    self.progress(
        f'loader: {results["sequences_per_s"]:,.0f} sequences/s, '
        f'{results["tokens_per_s"]:,.0f} tokens/s'
    )
    return results

  def _prepared_split(self, config, tokenizer) -> shards.PreparedSplit:
    signature = prepare.split_signature(config.data, 'train', tokenizer, self.settings.seq_len)
    return shards.PreparedSplit(prepare.split_folder(config.data, 'train', signature), signature)

  def train(self) -> Dict[str, Any]:
    """A 2-step run from nothing, then the same workdir resumed to 4 steps."""
    workdir = self.work / f'train_n{self.settings.seq_len}'
    shutil.rmtree(workdir, ignore_errors=True)
    results = {}
    for name, steps in (('first', FIRST_RUN_STEPS), ('resumed', RESUMED_RUN_STEPS)):
      overrides = {
          **self.settings.config_overrides,
          **self.settings.train_overrides(str(self.corpus_folder), str(workdir), steps),
      }
      first_step = FIRST_RUN_STEPS + 1 if name == 'resumed' else 1
      measured = run_measured(
          [
              '-m',
              'linformer_jax.train',
              f'--workdir={workdir}',
              *config_flags(self.settings.config_path, overrides),
          ],
          self.work / 'logs' / f'train_{name}.log',
          marker=rf'^step {first_step}/{steps}\b',
      )
      results[name] = {
          'wall_s': measured.wall_s,
          'first_step_s': measured.marker_s,
          'peak_rss_gib': measured.peak_rss_bytes / _GIB,
      }
      if measured.marker_s is None:
        raise RuntimeError(
            f'The {name} training run printed no `step {first_step}/{steps}` line; see '
            f'{self.work / "logs" / f"train_{name}.log"}.'
        )
      self.progress(
          f'train, {name}: {measured.wall_s:.1f} s in all, step {first_step} after '
          f'{measured.marker_s:.1f} s'
      )
    return results


# ---------------------------------------------------------------- report


def machine_description() -> Dict[str, Any]:
  """CPU count and model, total RAM, Python and platform."""
  model = platform.processor()
  try:
    with open('/proc/cpuinfo') as cpuinfo:
      names = [line.split(':', 1)[1].strip() for line in cpuinfo if line.startswith('model name')]
    model = names[0] if names else model
  except OSError:
    pass
  return {
      'cpus': os.cpu_count(),
      'physical_cpus': psutil.cpu_count(logical=False),
      'ram_gib': psutil.virtual_memory().total / _GIB,
      'cpu_model': model,
      'platform': platform.platform(),
  }


def _cell(entry: Mapping[str, Any], path: str, template: str) -> str:
  value: Any = entry
  for key in path.split('.'):
    if not isinstance(value, Mapping) or value.get(key) is None:
      return '–'
    value = value[key]
  return template.format(value)


# (row label, path in a size's entry, format)
TABLE_ROWS = (
    ('input text, MiB (train + validation)', 'corpus.input_mib', '{:,.0f}'),
    ('prepare, 1 worker: MiB/s', 'prepare.workers1.mib_per_s', '{:.2f}'),
    ('prepare, all cores: MiB/s', 'prepare.workers_all.mib_per_s', '{:.2f}'),
    ('prepare speed-up, all cores / 1 worker', 'prepare.speed_up', '{:.2f}x'),
    ('prepare, 1 worker: peak RSS GiB', 'prepare.workers1.peak_rss_gib', '{:.2f}'),
    ('prepare, all cores: peak RSS GiB', 'prepare.workers_all.peak_rss_gib', '{:.2f}'),
    ('prepare_data start-up, s', 'prepare.startup_s', '{:.1f}'),
    ('loader: masked sequences/s', 'loader.sequences_per_s', '{:,.0f}'),
    ('loader: tokens/s', 'loader.tokens_per_s', '{:,.0f}'),
    (f'end to end, {FIRST_RUN_STEPS} steps from nothing: s', 'train.first.wall_s', '{:.1f}'),
    (
        f'restart: s to step {FIRST_RUN_STEPS + 1} of the resumed run',
        'train.resumed.first_step_s',
        '{:.1f}',
    ),
)


def markdown_table(results: Mapping[str, Any]) -> str:
  """The report: a header line, then a row per measure and a column per size."""
  machine, settings = results['machine'], results['settings']
  overrides = ' '.join(
      f'--config.{key}={_flag_value(value)}' for key, value in settings['config_overrides'].items()
  )
  header = (
      f'Machine: {machine["cpus"]} CPUs ({machine["physical_cpus"]} physical, '
      f'{machine["cpu_model"]}), {machine["ram_gib"]:.1f} GiB RAM. Settings: --config '
      f'{settings["config"]} {overrides} seq_len {settings["seq_len"]}, tokenizer '
      f'{settings["tokenizer"]} ({settings["vocab_size"]}), loader batch '
      f'{settings["loader_batch_size"]} for {settings["loader_seconds"]:g} s. Preparation rates '
      "are input MiB over the prepare_data command's wall time (start-up included); peak RSS "
      f'sums the command and its workers, sampled every {SAMPLE_INTERVAL_S * 1e3:.0f} ms.'
  )
  sizes = sorted(results['sizes'], key=int)
  lines = [
      header,
      '',
      '| measure | ' + ' | '.join(f'{size} MB' for size in sizes) + ' |',
      '|---|' + '---:|' * len(sizes),
  ]
  for label, path, template in TABLE_ROWS:
    cells = [_cell(results['sizes'][size], path, template) for size in sizes]
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def merge_results(
    previous: Optional[Mapping[str, Any]],
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    measured: Mapping[str, Mapping[str, Any]],
) -> Dict[str, Any]:
  """New measurements over those of earlier runs with the same settings and
  machine (other sizes and stages are kept; anything else is dropped)."""
  same = (
      previous
      and previous.get('settings') == settings
      and previous.get('machine', {}).get('cpus') == machine['cpus']
  )
  sizes = {key: dict(value) for key, value in previous['sizes'].items()} if same else {}
  for size, entry in measured.items():
    sizes.setdefault(size, {}).update(entry)
  return {'machine': dict(machine), 'settings': dict(settings), 'sizes': sizes}


def run_benchmark(settings: Settings, progress: Callable[[str], None] = print) -> str:
  """Runs the stages for every size; writes the JSON and markdown; returns the table."""
  out = pathlib.Path(settings.out)
  out.mkdir(parents=True, exist_ok=True)
  measured = {}
  for size_mb in settings.sizes_mb:
    size = SizeBenchmark(settings, size_mb, progress)
    entry: Dict[str, Any] = {'corpus': {**size.corpus, 'input_mib': size.input_bytes / _MIB}}
    for stage in STAGES:
      if stage in settings.stages:
        entry[stage] = getattr(size, stage)()
    measured[str(size_mb)] = entry
  json_path = out / RESULTS_JSON
  previous = json.loads(json_path.read_text()) if json_path.exists() else None
  results = merge_results(previous, settings.describe(), machine_description(), measured)
  shards.write_json_atomically(json_path, results)
  table = markdown_table(results)
  (out / RESULTS_MD).write_text(table)
  return table
