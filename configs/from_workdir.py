"""The config a run saved in WORKDIR/config.json, as a config file.

For runs whose config is not a file of configs/, e.g. an imported checkpoint
(linformer_jax.import_checkpoint):

  python -m linformer_jax.evaluate --config configs/from_workdir.py:runs/roberta \
      --workdir runs/roberta

Any field can still be overridden, e.g. --config.data.source=text_files.
"""

import json
import pathlib

import ml_collections


def _tuples(value):
  """JSON's lists back to the tuples the configs hold."""
  if isinstance(value, dict):
    return {key: _tuples(item) for key, item in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(item) for item in value)
  return value


def get_config(workdir: str = '') -> ml_collections.ConfigDict:
  path = pathlib.Path(workdir) / 'config.json'
  if not workdir or not path.is_file():
    raise ValueError(
        f'{path} does not exist; pass a run folder as configs/from_workdir.py:WORKDIR.'
    )
  return ml_collections.ConfigDict(_tuples(json.loads(path.read_text())))
