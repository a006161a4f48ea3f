"""Micro-benchmark of one attention call: Linformer against full attention.

  python -m linformer_jax.attention_benchmark --seq_lens=512,1024,2048,4096,8192

For each n it jits both attention functions on random inputs, reads XLA's
compiled memory analysis (temporary bytes: exact and repeatable) and times the
forward pass (median of repeated runs after a warm-up), printing one table;
what is measured is described in `linformer_jax.analysis.attention_benchmark`.
The whole model's benchmark is `linformer_jax.benchmark`. Bad flags end with a
one-line error and exit code 2.
"""

from linformer_jax import cli
from linformer_jax.analysis import attention_benchmark
from linformer_jax.analysis import settings_flags
from linformer_jax.analysis.attention_benchmark import AttentionBenchmarkSettings

settings_flags.define_flags(AttentionBenchmarkSettings)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --FLAG=VALUE (see --help)')
  settings = settings_flags.from_flags(AttentionBenchmarkSettings)
  rows = attention_benchmark.run(settings)
  print(attention_benchmark.describe_run(settings))
  print(attention_benchmark.format_table(rows))


if __name__ == '__main__':
  cli.run(main)
