"""Ablation sweeps: train every variant of a sweep file, then tabulate and plot.

  python -m linformer_jax.sweep --sweep configs/sweeps/projected_len.py \
      --workdir runs/sweeps/projected_len [--only=k16,transformer] \
      [--set=total_steps=50 --set=warmup_steps=5]

Sweep files import `Sweep` and `Variant` from here; how a sweep runs, resumes
and reports is described in `linformer_jax.analysis.sweep`. Bad input (an
unknown key, a bad value, an unknown variant) ends with a one-line error and
exit code 2 before anything is trained.
"""

import os

from absl import flags

from linformer_jax import cli
from linformer_jax import storage
from linformer_jax.analysis.sweep import REPORT_FILE
from linformer_jax.analysis.sweep import Sweep  # re-exported for sweep files
from linformer_jax.analysis.sweep import Variant  # re-exported for sweep files
from linformer_jax.analysis.sweep import figure_file
from linformer_jax.analysis.sweep import load_sweep
from linformer_jax.analysis.sweep import report_table
from linformer_jax.analysis.sweep import run_sweep
from linformer_jax.errors import ConfigError

__all__ = ['Sweep', 'Variant', 'main']


def _define_flags() -> None:
  flags.DEFINE_string('sweep', None, 'Sweep file, e.g. configs/sweeps/projected_len.py.')
  flags.DEFINE_string('workdir', None, 'Directory of the sweep; variant NAME runs in WORKDIR/NAME.')
  flags.DEFINE_list('only', [], 'Comma-separated names of the variants to run (default: all).')
  flags.DEFINE_multi_string(
      'set', [], 'KEY=VALUE override for every variant, e.g. --set=total_steps=50; repeatable.'
  )
  flags.mark_flags_as_required(['sweep', 'workdir'])


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass overrides as --set=KEY=VALUE')
  settings = flags.FLAGS
  if storage.is_object_store(storage.location(settings.workdir)):
    raise ConfigError(
        f'--workdir={settings.workdir}: a sweep writes its report and figure to a local '
        'folder; give a local --workdir (each variant can still be trained alone on gs://).'
    )
  sweep = load_sweep(settings.sweep)
  run_sweep(sweep, settings.workdir, only=settings.only, sets=settings.set)
  print(report_table(sweep, settings.workdir), flush=True)
  print(
      f'Report in {os.path.join(settings.workdir, REPORT_FILE)}, figure in '
      f'{os.path.join(settings.workdir, figure_file(sweep))}.',
      flush=True,
  )


if __name__ == '__main__':
  # Defined here, not on import: sweep files import this module for `Sweep`.
  _define_flags()
  cli.run(main)
