"""Prepares the train and eval splits of a masked-LM config as ArrayRecord shards.

  python -m linformer_jax.prepare_data --config configs/gutenberg.py \
      --workdir runs/gutenberg --config.data.path=../shared/data/gutenberg

Trains the tokenizer (saved in --workdir, as `train` would) unless it is
there, then tokenizes the splits in `config.data.prepare_workers` processes
(all cores by default) and writes the shards to config.data.prepared_dir (or
the cache). `train` does the same by itself when the shards are missing; this
command does it ahead of time, or on many hosts at once: host I of N runs

  python -m linformer_jax.prepare_data --config ... --workdir RUN \
      --part_index=I --part_count=N

with config.data.prepared_dir on a filesystem all hosts share, after one host
has trained the tokenizer (run it there first with --tokenizer_only). A
killed preparation resumes after its last finished shard. Bad input ends with
a one-line error and exit code 2.
"""

import dataclasses
import json

from absl import flags

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.data import masked_lm
from linformer_jax.settings_flags import setting
from linformer_jax.training import run_config

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class PrepareSettings:
  part_index: int = setting(0, "This host's part of the splits.")
  part_count: int = setting(1, 'How many hosts prepare the splits.')
  tokenizer_only: bool = setting(False, 'Only train (or check) the tokenizer.')


def define_flags() -> None:
  settings_flags.define_flags(PrepareSettings)
  cli.define_config_flags()


def main(_):
  settings = settings_flags.from_flags(PrepareSettings)
  summary = masked_lm.prepare_splits(
      run_config.RunConfig.from_config(FLAGS.config),
      FLAGS.workdir,
      part_index=settings.part_index,
      part_count=settings.part_count,
      tokenizer_only=settings.tokenizer_only,
  )
  print(json.dumps(summary, indent=2, sort_keys=True), flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
