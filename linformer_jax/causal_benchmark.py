"""Causal language model benchmark: Linformer causal block attention against the Transformer.

  python -m linformer_jax.causal_benchmark --out=/tmp/causal_bench_out \
      --contexts=1024,2048,4096,8192,16384,32768 --seq_lens=1024,2048,4096,8192,16384 \
      --block_len=128 --slots=16 --linformer_query_blocks=0,4 --repeats=10

Times generation (one decode step at position C - 2: ms per token against the
context C) and the full causal forward pass (against n), with XLA's compiled
memory and FLOPs. Writes results.csv, table.md (also printed), generation.png
and forward.png into --out. What each cell measures is described in
`linformer_jax.analysis.causal_benchmark`. Bad flags end with a one-line error
and exit code 2.
"""

import sys
from typing import Any, Dict

from linformer_jax import cli
from linformer_jax.analysis import causal_benchmark
from linformer_jax.analysis import settings_flags
from linformer_jax.analysis.causal_benchmark import CausalBenchmarkSettings

settings_flags.define_flags(CausalBenchmarkSettings)


def _print_progress(row: Dict[str, Any]) -> None:
  result = f"{row['time_ms']:.3f} ms" if row['time_ms'] is not None else row['note']
  print(f'{causal_benchmark.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --FLAG=VALUE (see --help)')
  settings = settings_flags.from_flags(CausalBenchmarkSettings)
  rows = causal_benchmark.run_all(settings, progress=_print_progress)
  header = causal_benchmark.describe_run(settings)
  print(causal_benchmark.write_outputs(rows, settings.out, header))


if __name__ == '__main__':
  cli.run(main)
