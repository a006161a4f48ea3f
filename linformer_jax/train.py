"""Training from a config file: masked-LM pretraining or classification.

  python -m linformer_jax.train --config configs/default.py --workdir runs/default
  python -m linformer_jax.train --config configs/finetune_sst2.py --workdir runs/sst2 \
      --config.init_from=runs/gutenberg

Resumes from the newest checkpoint in --workdir (or --config.restore_step=N).
Bad input (config, data path, a workdir of another model) ends with a one-line
error and exit code 2; so does a run that diverged, or that ended on a step
that is not sound, its line naming the kept checkpoints and the exact command
to go on (docs/reliability.md): where --config.learning_rate overrode a lower
rate of the config file, the command goes back to the file's own.
"""

import sys
from typing import Optional

from absl import flags

from linformer_jax import cli
from linformer_jax import run_folder
from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import evaluation
from linformer_jax.training import tasks
from linformer_jax.training import trainer
from linformer_jax.training.metric_writers import json_text

FLAGS = flags.FLAGS


def define_flags() -> None:
  cli.define_config_flags()


def _overridden_learning_rate(diverged: float) -> Optional[float]:
  """The config file's own learning rate, where --config.learning_rate
  overrode it with the rate that diverged (ml_collections gives an override
  flag the file's value as its default); else None."""
  if 'config.learning_rate' not in FLAGS or not FLAGS['config.learning_rate'].present:
    return None
  if FLAGS.config.learning_rate != diverged:  # a re-run of a run that diverged at another rate
    return None
  return FLAGS['config.learning_rate'].default


def _going_on(error: divergence.DivergenceError) -> str:
  """The divergence error's line, with the exact command to go on."""
  rate, why = divergence.advised_learning_rate(
      error.learning_rate,
      _overridden_learning_rate(error.learning_rate),
      FLAGS['config'].config_filename,
  )
  command = divergence.command_to_go_on(
      sys.argv[1:],
      error.train_flags(rate),
      dropped=['--config.learning_rate'] if rate is None else [],
  )
  return f'{error.summary} Go on with {why}: {command}'


def main(_):
  cli.start_processes()
  try:
    results = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except divergence.DivergenceError as error:
    raise ConfigError(_going_on(error)) from None
  print(json_text(results, indent=2, sort_keys=True), flush=True)
  summary = tasks.task_of(FLAGS.config).summary(results)
  note = evaluation.perplexity_note(results.get('eval_perplexity'))
  print(f'{summary}{note}; results in {run_folder.RunFolder(FLAGS.workdir).results}', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
