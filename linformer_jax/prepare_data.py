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

import json

from absl import flags

from linformer_jax import cli
from linformer_jax.data import masked_lm

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags: defined when it runs, so that importing it defines none."""
  flags.DEFINE_integer('part_index', 0, "This host's part of the splits.")
  flags.DEFINE_integer('part_count', 1, 'How many hosts prepare the splits.')
  flags.DEFINE_boolean('tokenizer_only', False, 'Only train (or check) the tokenizer.')
  cli.define_config_flags()


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  summary = masked_lm.prepare_splits(
      FLAGS.config,
      FLAGS.workdir,
      part_index=flags.FLAGS.part_index,
      part_count=flags.FLAGS.part_count,
      tokenizer_only=flags.FLAGS.tokenizer_only,
  )
  print(json.dumps(summary, indent=2, sort_keys=True), flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
