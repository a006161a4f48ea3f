"""One attention call, Linformer against full attention: time and memory.

  python -m linformer_jax.attention_benchmark --seq_lens=512,1024,2048,4096,8192

It prints one table; docs/benchmarks.md describes it. Linformer's projection
E = F is a random [n, k] matrix with k = min(--projected_len, n). The whole
model's benchmark is `linformer_jax.benchmark`.
"""

import dataclasses
import statistics
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import measuring
from linformer_jax.analysis.benchmark_settings import DTYPES
from linformer_jax.analysis.tables import markdown_table
from linformer_jax.model import attention
from linformer_jax.settings_flags import setting
from linformer_jax.training import compiled_step
from linformer_jax.units import MIB


@dataclasses.dataclass(frozen=True)
class AttentionBenchmarkSettings:
  """What to measure; each field is the flag of its name, and a bad value raises a ConfigError."""

  seq_lens: Sequence[int] = setting(
      (512, 1024, 2048, 4096, 8192), 'Sequence lengths n to measure.', minimum=1
  )
  projected_len: int = setting(256, 'Projected length k.', minimum=1)
  batch: int = setting(1, 'Batch size.', minimum=1)
  heads: int = setting(12, 'Attention heads.', minimum=1)
  head_dim: int = setting(64, 'Features per head.', minimum=1)
  dtype: str = setting('float32', 'Dtype of q, k, v.', choices=DTYPES)
  repeats: int = setting(10, 'Timed runs per cell.', minimum=1)

  def __post_init__(self):
    settings_flags.check(self)


def measure(fn: Callable[..., Any], args: Sequence[Any], repeats: int) -> Tuple[float, float]:
  """Compiles fn for args; its median forward time (ms) and temporary MiB."""
  compiled = jax.jit(fn).lower(*args).compile()
  temp_bytes = compiled_step.planned_bytes(compiled)['temp_bytes']
  times = measuring.time_ms(lambda: compiled(*args), repeats)
  return statistics.median(times), temp_bytes / MIB


def run(settings: AttentionBenchmarkSettings) -> List[Dict[str, float]]:
  """Measures both attentions at every n; one row per n."""
  dtype = jnp.dtype(settings.dtype)
  rows = []
  for n in settings.seq_lens:
    keys = jax.random.split(jax.random.PRNGKey(n), 4)
    shape = (settings.batch, n, settings.heads, settings.head_dim)
    q, k, v = (jax.random.normal(key, shape, dtype) for key in keys[:3])
    projected_len = min(settings.projected_len, n)
    e = jax.random.normal(keys[3], (n, projected_len), dtype) / projected_len**0.5
    row = {'n': n, 'k': projected_len}
    for name, fn, args in (
        ('full', attention.dot_product_attention, (q, k, v)),
        ('linformer', attention.linformer_attention, (q, k, v, e, e)),
    ):
      row[f'{name}_ms'], row[f'{name}_temp_mib'] = measure(fn, args, settings.repeats)
    rows.append(row)
  return rows


def describe_run(settings: AttentionBenchmarkSettings) -> str:
  """One line naming the device and the settings, printed above the table."""
  return (
      f'device: {measuring.describe_device()}, '
      f'batch={settings.batch} heads={settings.heads} head_dim={settings.head_dim} '
      f'dtype={settings.dtype}, forward only, median of {settings.repeats} runs'
  )


def format_table(rows: List[Dict[str, float]]) -> str:
  """The rows as a markdown table with Linformer's speed-up and memory saving."""
  header = (
      'n | k | full ms | linformer ms | speed-up | full temp MiB | linformer temp MiB | '
      'memory saving'
  ).split(' | ')
  table_rows = []
  for r in rows:
    cells = [r['n'], r['k']]
    for quantity, fmt in (('ms', '.2f'), ('temp_mib', '.1f')):
      full, linformer = r[f'full_{quantity}'], r[f'linformer_{quantity}']
      # Linformer may plan no temporaries at all: its saving is then very large.
      cells += [format(full, fmt), format(linformer, fmt), f'{full / max(linformer, 1e-9):.1f}x']
    table_rows.append(cells)
  return markdown_table(header, table_rows)


def define_flags() -> None:
  settings_flags.define_flags(AttentionBenchmarkSettings)


def main(_):
  settings = settings_flags.from_flags(AttentionBenchmarkSettings)
  rows = run(settings)
  print(describe_run(settings))
  print(format_table(rows))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
