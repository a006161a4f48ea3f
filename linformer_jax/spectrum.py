"""The spectrum of the context-mapping matrix P, the Linformer paper's Figure 1.

  python -m linformer_jax.spectrum --config configs/default.py \
      --workdir runs/default --out runs/default/spectrum \
      --num_sequences=64 --index=128

Loads the newest checkpoint of a trained masked-LM run (or the kept step
--config.restore_step names), prints one summary line per layer and writes,
to --out (default WORKDIR/spectrum), spectrum.json,
cumulative_singular_values.png and heatmap.png; what is computed is described
in `linformer_jax.analysis.spectrum`. A workdir without a checkpoint (or
without the kept step) and an --out that is a file end with a one-line error
and exit code 2 before anything is computed; an --out it cannot write, after
the summary is printed.
"""

import os

from absl import flags

from linformer_jax import cli
from linformer_jax import storage
from linformer_jax.analysis.spectrum import compute_spectrum
from linformer_jax.analysis.spectrum import summary_lines
from linformer_jax.analysis.spectrum import title
from linformer_jax.analysis.spectrum import write_outputs


def define_flags() -> None:
  """The command's flags; defined only when run, so importing stays side-free."""
  cli.define_config_flags(reads_run=True)
  flags.DEFINE_string('out', '', 'Output folder (default WORKDIR/spectrum).')
  flags.DEFINE_integer('num_sequences', 64, 'Evaluation sequences to average over.')
  flags.DEFINE_integer(
      'index',
      128,
      '1-based singular value index to report (the '
      'paper: 128 of 512); clamped to the rank bound of P.',
  )


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  parsed = flags.FLAGS
  if parsed.out:
    storage.check_folder(parsed.out, '--out', writable=False)
  out = parsed.out or os.path.join(parsed.workdir, 'spectrum')
  report = compute_spectrum(
      parsed.config, parsed.workdir, num_sequences=parsed.num_sequences, index=parsed.index
  )
  print(f'{title(report)}: normalised cumulative singular values of P', flush=True)
  for line in summary_lines(report):
    print(line, flush=True)
  with cli.saving_printed_results(out):
    paths = write_outputs(report, out)
  print(f"results in {', '.join(paths)}", flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
