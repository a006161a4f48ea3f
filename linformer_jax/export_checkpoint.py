"""Exports a trained run as a Hugging Face folder that `transformers` loads.

  python -m linformer_jax.export_checkpoint --workdir runs/gutenberg --out exported/gutenberg \
      [--step 500]

A Transformer run shaped as RoBERTa or BERT becomes a plain RobertaFor... or
BertFor... folder; any other run of the Linformer or the Transformer becomes a
`model_type: linformer` folder with its PyTorch code beside the weights
(`trust_remote_code=True`). Each holds config.json, model.safetensors, the
tokenizer files and a model card (`checkpoints/hf_export.py`,
docs/checkpoint_import.md). `import_checkpoint --from OUT` reads a masked-LM
folder back into the same parameters, bitwise. What cannot be exported (a
rival attention kind, an extension's parts) ends with a one-line error and
exit code 2, nothing written.
"""

import dataclasses
from typing import Optional

from linformer_jax import api
from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.checkpoints import hf_export
from linformer_jax.settings_flags import setting


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  workdir: str = setting(help_text='The run folder that training wrote.')
  out: str = setting(help_text='The folder to write; it must not exist, or be empty.')
  step: Optional[int] = setting(None, 'A kept step to export; the newest when left out.')


def define_flags() -> None:
  settings_flags.define_flags(ExportSettings)


def main(_):
  settings = settings_flags.from_flags(ExportSettings)
  run = api.load(settings.workdir, settings.step)
  summary = hf_export.export_folder(run.config, run.variables, run.tokenizer, settings.out)
  for line in hf_export.describe(summary):
    print(line, flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
