"""Training from a config file: masked-LM pretraining or classification.

  python -m linformer_jax.train --config configs/default.py --workdir runs/default
  python -m linformer_jax.train --config configs/finetune_sst2.py --workdir runs/sst2 \
      --config.init_from=runs/gutenberg

Resumes from the newest checkpoint in --workdir. Bad input (config, data path,
a workdir of another model) ends with a one-line error and exit code 2.
"""

import json

from absl import flags

from linformer_jax import cli
from linformer_jax.training import tasks
from linformer_jax.training import trainer

cli.define_config_flags()
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  cli.start_processes()
  results = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  print(json.dumps(results, indent=2, sort_keys=True), flush=True)
  summary = tasks.task_of(FLAGS.config).summary(results)
  print(f'{summary}; results in {FLAGS.workdir}/{trainer.RESULTS_FILE}', flush=True)


if __name__ == '__main__':
  cli.run(main)
