"""What a run's learned projections E and F hold, against how they started.

  python -m linformer_jax.projection_stats --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_init_local \
      --config.model.projection_init=local

Loads the newest checkpoint, or the kept one of --step (else of
--config.restore_step), with the run's own config (pass the flags it was
trained with, --config.seed included), and prints, per
learned [n, k] matrix and for a fresh draw of each initialisation, how many
positions a slot mixes, the share of its weight in its own window and more;
and how far training moved each matrix from the run's step 0 (drawn again
from the seed), and how much of that move every slot shares
(`linformer_jax.analysis.projection_stats`). Writes them to
WORKDIR/projection_stats.json (projection_stats_STEP.json for a step asked). A
workdir without a checkpoint, or without the kept --step, ends with a
one-line error and exit code 2, and so does a workdir it cannot write, after
the statistics are printed.
"""

import json
import os

from absl import flags

from linformer_jax import cli
from linformer_jax import storage
from linformer_jax.analysis.projection_stats import projection_report
from linformer_jax.analysis.projection_stats import summary_lines

flags.DEFINE_integer('step', 0, 'A kept step to read instead of the newest (0).')


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  parsed = flags.FLAGS
  if parsed.step < 0:
    cli.fail(f'--step={parsed.step} is not allowed: use a kept step, or 0 for the newest.')
  workdir = storage.location(parsed.workdir)
  report = projection_report(parsed.config, workdir, parsed.step or None)
  for line in summary_lines(report):
    print(line, flush=True)
  asked = parsed.step or parsed.config.restore_step
  name = f'projection_stats_{asked}.json' if asked else 'projection_stats.json'
  path = os.path.join(workdir, name)
  with cli.saving_printed_results(path):
    storage.write_text(path, json.dumps(report, indent=2, sort_keys=True))
  print(f'results in {path}', flush=True)


if __name__ == '__main__':
  cli.define_config_flags(reads_run=True)
  cli.run(main)
