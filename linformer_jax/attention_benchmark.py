"""Micro-benchmark of one attention call: Linformer against full attention.

  python -m linformer_jax.attention_benchmark --seq_lens=512,1024,2048,4096,8192

For each n it jits both attention functions on random inputs, reads XLA's
compiled memory analysis (temporary bytes: exact and repeatable) and times the
forward pass (median of repeated runs after a warm-up). Both functions are
timed side by side in one process, so their ratio is meaningful even on a noisy
machine. The whole model's benchmark is a separate tool; this one isolates the
attention.
"""

import statistics
import time
from typing import Callable, Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from linformer_jax.model import attention

_SEQ_LENS = flags.DEFINE_list(
    'seq_lens', ['512', '1024', '2048', '4096', '8192'], 'Sequence lengths n to measure.'
)
_PROJECTED_LEN = flags.DEFINE_integer('projected_len', 256, 'Projected length k.')
_BATCH = flags.DEFINE_integer('batch', 1, 'Batch size.')
_HEADS = flags.DEFINE_integer('heads', 12, 'Attention heads.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Features per head.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Dtype of q, k, v.')
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs per cell.')


def measure(fn: Callable, args, repeats: int) -> Dict[str, float]:
  """Compiles fn, returns its temporary bytes and median forward time (ms)."""
  compiled = jax.jit(fn).lower(*args).compile()
  memory = compiled.memory_analysis()
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append((time.perf_counter() - start) * 1e3)
  return {'time_ms': statistics.median(times), 'temp_bytes': float(memory.temp_size_in_bytes)}


def run(
    seq_lens: List[int],
    projected_len: int,
    batch: int,
    heads: int,
    head_dim: int,
    dtype,
    repeats: int,
) -> List[Dict[str, float]]:
  """Measures both attentions at every n; returns one row per n."""
  rows = []
  for n in seq_lens:
    keys = jax.random.split(jax.random.PRNGKey(n), 4)
    q, k, v = (jax.random.normal(key, (batch, n, heads, head_dim), dtype) for key in keys[:3])
    k_eff = min(projected_len, n)
    e = jax.random.normal(keys[3], (n, k_eff), dtype) / k_eff**0.5
    full = measure(attention.dot_product_attention, (q, k, v), repeats)
    linformer = measure(attention.linformer_attention, (q, k, v, e, e), repeats)
    rows.append(
        {
            'n': n,
            'k': k_eff,
            'full_ms': full['time_ms'],
            'linformer_ms': linformer['time_ms'],
            'full_temp_mib': full['temp_bytes'] / 2**20,
            'linformer_temp_mib': linformer['temp_bytes'] / 2**20,
        }
    )
  return rows


def format_table(rows: List[Dict[str, float]]) -> str:
  lines = [
      '| n | k | full ms | linformer ms | speed-up | full temp MiB | '
      'linformer temp MiB | memory saving |',
      '|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    lines.append(
        f"| {r['n']} | {r['k']} | {r['full_ms']:.2f} | {r['linformer_ms']:.2f} | "
        f"{r['full_ms'] / r['linformer_ms']:.1f}x | {r['full_temp_mib']:.1f} | "
        f"{r['linformer_temp_mib']:.1f} | "
        f"{r['full_temp_mib'] / max(r['linformer_temp_mib'], 1e-9):.1f}x |"
    )
  return '\n'.join(lines)


def main(argv):
  del argv
  rows = run(
      [int(n) for n in _SEQ_LENS.value],
      _PROJECTED_LEN.value,
      _BATCH.value,
      _HEADS.value,
      _HEAD_DIM.value,
      jnp.dtype(_DTYPE.value),
      _REPEATS.value,
  )
  print(
      f'device: {jax.devices()[0].device_kind} ({jax.default_backend()}), '
      f'batch={_BATCH.value} heads={_HEADS.value} head_dim={_HEAD_DIM.value} '
      f'dtype={_DTYPE.value}, forward only, median of {_REPEATS.value} runs'
  )
  print(format_table(rows))


if __name__ == '__main__':
  app.run(main)
