"""Data-pipeline benchmark: preparation throughput and memory, loader rate, restart time.

  python -m linformer_jax.data_benchmark --out runs/data_benchmark --sizes_mb=256,1024 \
      --seq_len=512

For each size it writes a corpus of English text files (OUT/corpus_<size>MB,
reused later), times `prepare_data` with 1 worker and with all cores (MiB/s and
peak RSS of the process tree), the masked-LM loader on the shards (sequences/s,
tokens/s), and `train` for 2 steps from nothing and resumed (seconds to its
next step). --stages=prepare,loader,train picks stages; sizes and stages of
earlier runs with the same settings stay in OUT/data_benchmark.json. Writes
OUT/data_benchmark.md (also printed). Any config field can be overridden as
--config.FIELD=VALUE; the commands it runs get the same overrides. Bad flags
end with a one-line error and exit code 2.
"""

import sys

from absl import flags
from ml_collections import config_flags

from linformer_jax import cli
from linformer_jax.analysis import data_benchmark
from linformer_jax.analysis import settings_flags

cli.define_config_file_flag('configs/default.py', 'Config the commands run with.')
settings_flags.define_flags(data_benchmark.Settings)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  config_flag = flags.FLAGS['config']
  settings = settings_flags.from_flags(
      data_benchmark.Settings,
      config_path=config_flags.get_config_filename(config_flag),
      config=config_flag.value,
      config_overrides=config_flags.get_override_values(config_flag),
  )
  print(data_benchmark.run_benchmark(settings, lambda line: print(line, file=sys.stderr)))


if __name__ == '__main__':
  cli.run(main)
