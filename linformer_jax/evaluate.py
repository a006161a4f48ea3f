"""Evaluates the newest checkpoint of a run and writes WORKDIR/eval_SPLIT.json.

  python -m linformer_jax.evaluate --config configs/default.py --workdir runs/default \
      --split validation

Prints masked-token loss, perplexity and accuracy on the split next to a
unigram model's perplexity; for a classification run, loss and accuracy next
to the majority class's accuracy.
"""

import json

from absl import flags

from linformer_jax import cli
from linformer_jax.training import trainer

cli.define_config_flags()
_SPLIT = flags.DEFINE_string(
    'split', 'validation', "Split to evaluate: 'validation', 'test' or 'train'."
)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  cli.start_processes()
  results = trainer.evaluate_checkpoint(FLAGS.config, FLAGS.workdir, _SPLIT.value)
  print(json.dumps(results, indent=2, sort_keys=True), flush=True)


if __name__ == '__main__':
  cli.run(main)
