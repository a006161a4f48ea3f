"""Training from a config file: masked-LM pretraining or classification.

  python -m linformer_jax.train --config configs/default.py --workdir runs/default
  python -m linformer_jax.train --config configs/finetune_sst2.py --workdir runs/sst2 \
      --config.init_from=runs/gutenberg

Resumes from the newest checkpoint in --workdir (or --config.restore_step=N).
Bad input (config, data path, a workdir of another model) ends with a one-line
error and exit code 2; so does a run that diverged, its line naming the kept
checkpoints and the exact command to go on (docs/reliability.md).
"""

import json
import sys

from absl import flags

from linformer_jax import cli
from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import tasks
from linformer_jax.training import trainer

FLAGS = flags.FLAGS


def define_flags() -> None:
  cli.define_config_flags()


def main(_):
  cli.start_processes()
  try:
    results = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except divergence.NonFiniteLossError as error:
    command = divergence.command_to_go_on(error, sys.argv[1:])
    raise ConfigError(f'{error.summary} Go on with a lower learning rate: {command}') from None
  print(json.dumps(results, indent=2, sort_keys=True), flush=True)
  summary = tasks.task_of(FLAGS.config).summary(results)
  print(f'{summary}; results in {FLAGS.workdir}/{trainer.RESULTS_FILE}', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
