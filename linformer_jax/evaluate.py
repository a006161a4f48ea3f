"""Evaluates the newest checkpoint of a run and writes WORKDIR/eval_SPLIT.json.

  python -m linformer_jax.evaluate --config configs/default.py --workdir runs/default \
      --split validation [--config.restore_step=STEP]

Prints masked-token loss, perplexity and accuracy on the split (`eval_loss`,
`eval_perplexity`, `eval_accuracy`: the names training's eval_results.json
gives them) next to a unigram model's perplexity (`unigram_perplexity`); for a
classification run, loss and accuracy next to the majority class's accuracy
(`majority_class_accuracy`). They are what
`linformer_jax.load(WORKDIR, with_data=True, split=SPLIT).evaluate()` gives,
on the run's config with the --config.X overrides. The results name the step
scored (`step`) and the split (`eval_split`): the newest step, or the kept
step --config.restore_step names (then saved as eval_SPLIT_STEP.json); a step
that is not kept is refused in one line that lists the kept ones. A damaged
newest step is skipped with a one-line warning naming it and what is wrong,
and a damaged step asked for is refused saying so. Evaluating never moves a
checkpoint (`linformer_jax.training.run_loading`). A workdir it
cannot write still gets its results printed, then one error line saying they
were not saved.
"""

import dataclasses

from absl import flags

from linformer_jax import api
from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.settings_flags import setting
from linformer_jax.training import evaluation
from linformer_jax.training.metric_writers import json_text

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class EvaluateSettings:
  split: str = setting('validation', "Split to evaluate: 'validation', 'test' or 'train'.")


def define_flags() -> None:
  settings_flags.define_flags(EvaluateSettings)
  cli.define_config_flags(reads_run=True)


def main(_):
  settings = settings_flags.from_flags(EvaluateSettings)
  cli.start_processes()
  run = api.load(FLAGS.workdir, with_data=True, split=settings.split, config=FLAGS.config)
  results = run.evaluate()
  print(json_text(results, indent=2, sort_keys=True), flush=True)
  path = evaluation.results_path(run.parts.settings.loop, FLAGS.workdir, settings.split)
  with cli.saving_printed_results(path):
    evaluation.write_results(path, results)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
