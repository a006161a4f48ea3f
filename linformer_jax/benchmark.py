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

from linformer_jax import cli
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis import settings_flags
from linformer_jax.analysis.benchmark import describe_run
from linformer_jax.analysis.benchmark import measure_matmul_gflops
from linformer_jax.analysis.benchmark import run_grid
from linformer_jax.analysis.benchmark_settings import BenchmarkSettings

settings_flags.define_flags(BenchmarkSettings)


def _print_progress(row: Dict[str, Any]) -> None:
  if row['time_ms'] is None:
    result = row['note']
  else:
    result = f"{row['time_ms']:.1f} ms at batch {row['batch']}"
  print(f'{benchmark_report.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --FLAG=VALUE (see --help)')
  settings = settings_flags.from_flags(BenchmarkSettings)
  matmul_gflops = measure_matmul_gflops(settings.matmul_sizes, dtype=settings.dtype)
  rows = run_grid(settings, matmul_gflops, progress=_print_progress)
  print(
      benchmark_report.write_outputs(
          rows, settings.out, matmul_gflops, describe_run(settings), settings.memory_budget_bytes
      )
  )


if __name__ == '__main__':
  cli.run(main)
