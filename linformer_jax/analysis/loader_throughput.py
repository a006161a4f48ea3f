"""The training loader's rate and the CPU it takes: tokens/s, and tokens/s per core.

The data benchmark's loader stage (`data_benchmark`) times `packed_batches.create_train_iterator`
with masking, as a training run reads it, under loader settings (grain worker processes, read
threads, prefetch). Tokens are positions of the masked batches, padding included; per core, they
are counted over the CPU seconds of the loader's process tree (docs/data.md, "Loader throughput",
says why).
"""

import dataclasses
import statistics
import time
from typing import Any, Dict, List, Sequence

import psutil

from linformer_jax.analysis import process_memory
from linformer_jax.data import loaders
from linformer_jax.data import masked_lm
from linformer_jax.data import packed_batches
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.settings_flags import require


@dataclasses.dataclass(frozen=True)
class LoaderSetting:
  """grain's parallelism: config.data.worker_count, read_threads, prefetch_buffer."""

  worker_count: int = 0
  read_threads: int = 0
  prefetch_buffer: int = 0

  @classmethod
  def parse(cls, text: str) -> 'LoaderSetting':
    """WORKERS:THREADS:PREFETCH, e.g. '2:0:0' or '0:1:4'."""
    parts = text.split(':')
    ok = len(parts) == 3 and all(part.isdigit() for part in parts)
    advice = 'give WORKERS:THREADS:PREFETCH as integers >= 0, e.g. 2:0:0 or 0:1:4'
    require(ok, 'loader_settings', repr(text), advice)
    return cls(*map(int, parts))

  @property
  def label(self) -> str:
    return f'{self.worker_count}:{self.read_threads}:{self.prefetch_buffer}'

  def describe(self) -> str:
    return (
        f'{self.worker_count} workers, {self.read_threads} read threads, '
        f'prefetch {self.prefetch_buffer}'
    )


def tree_cpu_seconds(process: psutil.Process) -> float:
  """User plus system CPU seconds of a process, all its threads, and its
  descendants that are alive now."""
  return float(process_memory.tree_total(process, lambda member: sum(member.cpu_times()[:2])))


def loader_throughput(
    source,
    tokenizer: tokenizer_lib.Tokenizer,
    *,
    batch_size: int = 32,
    mask_rate: float = 0.15,
    seconds: float = 10.0,
    warmup_batches: int = 5,
    seed: int = 0,
    setting: LoaderSetting = LoaderSetting(),
) -> Dict[str, float]:
  """Masked training batches of `packed_batches.create_train_iterator`, timed here.

  `source` holds packed sequences [num_sequences, seq_len] (an array, or a grain source such as
  `shards.ShardedSequences`); batch_size, mask_rate and seed are as a training run passes them.
  Batches are read for at least `seconds` after `warmup_batches` (worker processes start and
  fill their buffers meanwhile). Returns sequences_per_s, tokens_per_s, batches, seconds,
  cpu_seconds (of the process tree), cores_used and tokens_per_core_s.
  """
  transform = masked_lm.DynamicMasking(tokenizer, mask_rate)
  iterator = packed_batches.create_train_iterator(
      source,
      loaders.LoaderSettings(batch_size=batch_size, seed=seed, **dataclasses.asdict(setting)),
      transform,
  )
  for _ in range(warmup_batches):
    next(iterator)
  process = psutil.Process()
  batches, positions = 0, 0
  cpu_start = tree_cpu_seconds(process)
  start = time.perf_counter()
  while batches == 0 or time.perf_counter() - start < seconds:
    positions += next(iterator)['inputs'].size
    batches += 1
  elapsed = time.perf_counter() - start
  cpu_seconds = tree_cpu_seconds(process) - cpu_start
  del iterator  # its worker processes stop as grain's iterators are collected
  return {
      'sequences_per_s': batches * batch_size / elapsed,
      'tokens_per_s': positions / elapsed,
      'batches': batches,
      'seconds': elapsed,
      'cpu_seconds': cpu_seconds,
      'cores_used': cpu_seconds / elapsed,
      'tokens_per_core_s': positions / cpu_seconds if cpu_seconds > 0 else float('nan'),
  }


def summarize(setting: LoaderSetting, runs: Sequence[Dict[str, float]]) -> Dict[str, Any]:
  """Best and median of repeated timings of one setting (the median of an
  even count is the mean of the middle two)."""
  summary: Dict[str, Any] = {**dataclasses.asdict(setting), 'runs': list(runs)}
  for measure in ('sequences_per_s', 'tokens_per_s', 'tokens_per_core_s', 'cores_used'):
    values: List[float] = [run[measure] for run in runs]
    summary[f'best_{measure}'] = max(values)
    summary[f'median_{measure}'] = statistics.median(values)
  return summary
