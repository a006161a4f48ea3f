"""Imports a Hugging Face RoBERTa or BERT checkpoint, or a folder that
`export_checkpoint` wrote, as a run of this project.

  python -m linformer_jax.import_checkpoint --from /path/to/roberta-base \
      --workdir runs/roberta --config configs/imported.py

--from is a folder in the Hugging Face layout (config.json, model.safetensors,
tokenizer.json), or a hub name when the hub can be reached. The run holds the
checkpoint at step 0 and its tokenizer; `--config.model.attention=linformer`
adds E/F to the imported weights. It prints what it took and the flags of the
commands that use the run (docs/checkpoint_import.md). A folder that cannot
be imported ends with a one-line error and exit code 2, nothing written.
"""

import dataclasses

from absl import flags

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.settings_flags import setting
from linformer_jax.training import hf_import

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class ImportSettings:
  source: str = setting(
      help_text='The checkpoint: a Hugging Face folder, or a hub name (needs network).',
      flag='from',
  )


def define_flags() -> None:
  settings_flags.define_flags(ImportSettings)
  cli.define_config_flags()
  cli.local_path_flag('workdir', 'an import is written to a local folder: give a local --workdir')


def main(_):
  settings = settings_flags.from_flags(ImportSettings)
  _, summary = hf_import.import_checkpoint(settings.source, FLAGS.workdir, FLAGS.config)
  for line in hf_import.describe(summary, FLAGS.workdir):
    print(line, flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
