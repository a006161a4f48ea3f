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

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/default.py', 'Config the commands run with.', lock_config=True
)
_OUT = flags.DEFINE_string('out', None, 'Folder of the corpora, runs and results.')
flags.mark_flag_as_required('out')
_SIZES_MB = flags.DEFINE_list('sizes_mb', ['256', '1024'], 'Training corpus sizes, in MiB.')
_SEQ_LEN = flags.DEFINE_integer(
    'seq_len', 0, "Packed sequence length (config.model.max_len); 0 keeps the config's."
)
_STAGES = flags.DEFINE_list(
    'stages', list(data_benchmark.STAGES), 'Stages to run (the corpus is always made).'
)
_SEED = flags.DEFINE_integer('seed', 0, "Seeds the corpus's document order.")
_LOADER_BATCH_SIZE = flags.DEFINE_integer('loader_batch_size', 32, 'Sequences per loader batch.')
_LOADER_SECONDS = flags.DEFINE_float('loader_seconds', 10.0, 'Seconds the loader is timed.')
_LOADER_WARMUP_BATCHES = flags.DEFINE_integer(
    'loader_warmup_batches', 5, 'Loader batches read before the timing starts.'
)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  settings = data_benchmark.Settings(
      out=_OUT.value,
      sizes_mb=cli.int_list('sizes_mb', _SIZES_MB.value),
      config_path=config_flags.get_config_filename(flags.FLAGS['config']),
      config=_CONFIG.value,
      config_overrides=config_flags.get_override_values(flags.FLAGS['config']),
      seq_len=_SEQ_LEN.value,
      stages=_STAGES.value,
      seed=_SEED.value,
      loader_batch_size=_LOADER_BATCH_SIZE.value,
      loader_seconds=_LOADER_SECONDS.value,
      loader_warmup_batches=_LOADER_WARMUP_BATCHES.value,
  )
  print(data_benchmark.run_benchmark(settings, lambda line: print(line, file=sys.stderr)))


if __name__ == '__main__':
  cli.run(main)
