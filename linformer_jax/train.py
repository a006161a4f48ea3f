"""Masked-LM pretraining from a config file.

  python -m linformer_jax.train --config configs/default.py --workdir runs/default

Resumes from the newest checkpoint in --workdir. Bad input (config, data path,
a workdir of another model) ends with a one-line error and exit code 2.
"""

import json

from absl import flags

from linformer_jax import cli
from linformer_jax import trainer

cli.define_config_flags()
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  cli.start_processes()
  results = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  print(json.dumps(results, indent=2, sort_keys=True), flush=True)
  print(f'{results["eval_split"]} perplexity {results["eval_perplexity"]:.1f} after '
        f'{results["step"]} steps (a unigram model: '
        f'{results["unigram_perplexity"]:.1f}); results in '
        f'{FLAGS.workdir}/{trainer.RESULTS_FILE}', flush=True)


if __name__ == '__main__':
  cli.run(main)
