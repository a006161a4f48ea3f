"""The config a run saved in WORKDIR/config.json, as a config file.

For runs whose config is not a file of configs/, e.g. an imported checkpoint
(linformer_jax.import_checkpoint):

  python -m linformer_jax.evaluate --config configs/from_workdir.py:runs/roberta \
      --workdir runs/roberta

Any field can still be overridden, e.g. --config.data.source=text_files.

`encoder_of` is what a fine-tuning config does with its own argument,
configs/finetune_sst2.py:RUN: it starts from run RUN's encoder, taking the
model fields that fix the encoder's arrays and the tokenizer from RUN.
"""

import json
import pathlib

import ml_collections

from linformer_jax.training import fine_tuning
from linformer_jax.training import run_config


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
        f'{path} does not exist; the part after ":" in --config (configs/X.py:WORKDIR) '
        'must be a run folder, one with config.json.'
    )
  return ml_collections.ConfigDict(_tuples(json.loads(path.read_text())))


def encoder_of(config: ml_collections.ConfigDict, init_from: str) -> ml_collections.ConfigDict:
  """`config` set to fine-tune the encoder of run `init_from` ('' leaves it as
  it is): config.init_from, the model fields that fix the encoder's arrays
  (sizes, attention, k, sharing, projection, layer norms, a checkpoint's
  segments), the extensions that register the run's own parts, and the data
  fields that fix its token ids, from the run's config.json. The task's own
  fields (pooling, dropout, data) stay config's."""
  if not init_from:
    return config
  saved = get_config(init_from)
  config.init_from = init_from
  for field in fine_tuning.ENCODER_FIELDS:
    if field in saved.model:
      config.model[field] = saved.model[field]
  if saved.model.get('num_segments', 0):  # a checkpoint's token types (RoBERTa 1, BERT 2)
    config.model.num_segments = saved.model.num_segments
  for field in run_config.DATA_FIELDS_FIXED_BY_A_RUN:
    if field in saved.get('data', {}):
      config.data[field] = saved.data[field]
  # The run's own parts (e.g. a projection registered by a file of its own).
  extensions = tuple(saved.get('extensions', ())) + tuple(config.get('extensions', ()))
  config.extensions = tuple(dict.fromkeys(extensions))
  return config
