"""Linear probes and `<s>` attention of a pretrained encoder, layer by layer.

  python -m linformer_jax.pooling_probe --config configs/finetune_sst2.py \
      --config.init_from=runs/gutenberg --workdir runs/probe_linformer
  python -m linformer_jax.pooling_probe --config configs/finetune_sst2.py \
      --config.init_from=runs/gutenberg_transformer --config.model.attention=full \
      --workdir runs/probe_transformer

Reads the encoder of config.init_from, fits a logistic regression on the frozen
`<s>` vector and on the mean of the real tokens at every layer, and measures
how widely the `<s>` query attends (`linformer_jax.analysis.pooling_probe`).
Writes WORKDIR/probe.json (and the tokenizer the data needs) and prints one
line per layer. Bad input ends with a one-line error and exit code 2.
"""

import json
import os

from absl import flags

from linformer_jax import cli
from linformer_jax import storage
from linformer_jax.analysis import settings_flags
from linformer_jax.analysis.pooling_probe import ProbeSettings
from linformer_jax.analysis.pooling_probe import probe
from linformer_jax.analysis.pooling_probe import summary_lines


def define_flags() -> None:
  """The command's flags; defined only when run, so importing stays side-free."""
  cli.define_config_flags()
  settings_flags.define_flags(ProbeSettings)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --config.FIELD=VALUE')
  parsed = flags.FLAGS
  settings = settings_flags.from_flags(ProbeSettings)
  report = probe(parsed.config, parsed.workdir, train_batches=settings.train_batches)
  workdir = storage.location(parsed.workdir)
  storage.makedirs(workdir)
  path = os.path.join(workdir, 'probe.json')
  storage.write_text(path, json.dumps(report, indent=2))
  print(
      f"{report['attention']} encoder of {report['init_from']}: {report['train_examples']} "
      f"training and {report['eval_examples']} {report['eval_split']} examples "
      f"(majority class {report['eval_majority_accuracy']:.3f})",
      flush=True,
  )
  for line in summary_lines(report):
    print(line, flush=True)
  print(f'results in {path}', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
