"""Inference time and memory of the whole model: Linformer against the Transformer.

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3

Against the memory-efficient Transformer too (queries and MLP 512 positions
at a time, jax.nn.dot_product_attention's XLA kernel), and with the paper's
method: every cell at the largest batch whose compiled memory fits 16 GiB (a
budget the machine can run: at most --memory_limit_gb / 1.5, as a budget run
peaks at about 1.5 times its budget):

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3 \
      --inference_chunk=512 --attention_kernel=xla --memory_budget_gb=16

Writes results.csv, table.md (speed-up / memory saving per n and k against
each Transformer, also printed) and time_per_token.png, memory.png into
--out. What each cell measures is described in
`linformer_jax.analysis.benchmark`. Bad flags end with a one-line error and
exit code 2.
"""

import sys
from typing import Any, Dict

from absl import flags

from linformer_jax import cli
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis.benchmark import BenchmarkSettings
from linformer_jax.analysis.benchmark import default_memory_limit_bytes
from linformer_jax.analysis.benchmark import describe_run
from linformer_jax.analysis.benchmark import measure_matmul_gflops
from linformer_jax.analysis.benchmark import run_grid
from linformer_jax.errors import ConfigError
from linformer_jax.model.attention import ATTENTION_KERNELS

_OUT = flags.DEFINE_string('out', None, 'Directory for results.csv, table.md and the plots.')
flags.mark_flag_as_required('out')
_SEQ_LENS = flags.DEFINE_list('seq_lens', [str(2**p) for p in range(9, 17)], 'Sequence lengths n.')
_PROJECTED_LENS = flags.DEFINE_list(
    'projected_lens',
    ['128', '256', '512', '1024', '2048'],
    "Linformer's projected lengths k; only k < n are measured.",
)
_NUM_LAYERS = flags.DEFINE_integer('num_layers', 12, 'Encoder layers.')
_HIDDEN_DIM = flags.DEFINE_integer('hidden_dim', 768, 'Model width.')
_NUM_HEADS = flags.DEFINE_integer('num_heads', 12, 'Attention heads.')
_MLP_DIM = flags.DEFINE_integer('mlp_dim', 3072, 'Feed-forward hidden width.')
_BATCH = flags.DEFINE_integer(
    'batch', 1, 'Sequences per forward pass; ignored with --memory_budget_gb.'
)
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs per cell.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_TRAIN_THROUGHPUT = flags.DEFINE_boolean(
    'train_throughput', False, 'Also time an MLM training step per cell.'
)
_MATMUL_SIZES = flags.DEFINE_list(
    'matmul_sizes',
    ['1024', '2048', '4096'],
    'Sides of the square jnp.dots timed for the matmul rate (the best counts).',
)
_MEMORY_LIMIT_GB = flags.DEFINE_float(
    'memory_limit_gb',
    None,
    'At a fixed --batch, skip cells planning more temporary + argument '
    'GiB; default 80% of the device memory JAX may use (of the host RAM on '
    'CPU). With --memory_budget_gb it only guards --train_throughput.',
)
_INFERENCE_CHUNK = flags.DEFINE_integer(
    'inference_chunk',
    0,
    'Positions per chunk of the queries and MLP of Linformer and of an added '
    "memory-efficient Transformer ('transformer-efficient'); 0 runs one pass.",
)
_ATTENTION_KERNEL = flags.DEFINE_enum(
    'attention_kernel',
    'einsum',
    list(ATTENTION_KERNELS),
    'Attention of the memory-efficient Transformer, added at every n unless '
    'einsum with --inference_chunk=0: einsum, or jax.nn.dot_product_attention '
    'with its xla or cudnn (NVIDIA GPU, bfloat16) implementation.',
)
_MEMORY_BUDGET_GB = flags.DEFINE_float(
    'memory_budget_gb',
    None,
    "The paper's method: run every cell at the largest batch whose compiled "
    'temporary + argument + output bytes fit this many GiB, instead of --batch; '
    'at most --memory_limit_gb / 1.5 (a budget run peaks at about 1.5 times it).',
)
_MAX_BATCH = flags.DEFINE_integer(
    'max_batch', 4096, 'The largest batch the --memory_budget_gb search tries.'
)


def settings_from_flags() -> BenchmarkSettings:
  """Builds the validated settings from the command-line flags."""
  limit_gb, budget_gb = _MEMORY_LIMIT_GB.value, _MEMORY_BUDGET_GB.value
  return BenchmarkSettings(
      seq_lens=cli.int_list('seq_lens', _SEQ_LENS.value),
      projected_lens=cli.int_list('projected_lens', _PROJECTED_LENS.value),
      num_layers=_NUM_LAYERS.value,
      hidden_dim=_HIDDEN_DIM.value,
      num_heads=_NUM_HEADS.value,
      mlp_dim=_MLP_DIM.value,
      batch=_BATCH.value,
      repeats=_REPEATS.value,
      dtype=_DTYPE.value,
      train_throughput=_TRAIN_THROUGHPUT.value,
      memory_limit_bytes=(default_memory_limit_bytes() if limit_gb is None else limit_gb * 2**30),
      inference_chunk=_INFERENCE_CHUNK.value,
      attention_kernel=_ATTENTION_KERNEL.value,
      memory_budget_bytes=None if budget_gb is None else budget_gb * 2**30,
      max_batch=_MAX_BATCH.value,
  )


def _print_progress(row: Dict[str, Any]) -> None:
  if row['time_ms'] is None:
    result = row['note']
  else:
    result = f"{row['time_ms']:.1f} ms at batch {row['batch']}"
  print(f'{benchmark_report.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def main(argv):
  del argv
  settings = settings_from_flags()
  matmul_sizes = cli.int_list('matmul_sizes', _MATMUL_SIZES.value)
  if not matmul_sizes or min(matmul_sizes) < 1:
    raise ConfigError(
        f'--matmul_sizes={",".join(_MATMUL_SIZES.value)} is not '
        'allowed: give positive matrix sides, e.g. 1024,2048,4096.'
    )
  matmul_gflops = measure_matmul_gflops(matmul_sizes, dtype=settings.dtype)
  rows = run_grid(settings, matmul_gflops, progress=_print_progress)
  print(
      benchmark_report.write_outputs(
          rows, _OUT.value, matmul_gflops, describe_run(settings), settings.memory_budget_bytes
      )
  )


if __name__ == '__main__':
  cli.run(main)
