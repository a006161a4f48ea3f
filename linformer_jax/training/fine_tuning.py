"""Fine-tuning: the encoder of a pretraining run inside a classifier's train state.

`check_pretrained_encoder` compares the pretraining run's saved config with the
new one and names the first field that differs (before anything is built);
`with_pretrained_encoder` reads the encoder's arrays from its newest checkpoint
into a freshly initialised train state, leaving the classification head new.
"""

from typing import Any, Dict, List, Tuple

from linformer_jax import run_folder
from linformer_jax.checkpoints import partial_restore
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import run_config
from linformer_jax.training.train_steps import TrainState

# Encoder parameters that a fine-tuned model may add to a pretrained encoder
# without them (they start from their initial values: zeros).
FRESH_ENCODER_PARAMS = {'segment_embedding': 'num_segments'}
# Model fields that decide the encoder's arrays; fine-tuning needs them equal.
ENCODER_FIELDS = (
    'vocab_size',
    'max_len',
    'num_layers',
    'num_heads',
    'hidden_dim',
    'mlp_dim',
    'attention',
    'projected_len',
    'sharing',
    'projection',
    'pre_layer_norm',
    'layer_norm_epsilon',
)


def check_pretrained_encoder(config: run_config.RunConfig) -> Dict[str, Any]:
  """Refuses an init_from run whose encoder differs from config.model's.

  Returns the pretraining run's saved model config.
  """
  store = CheckpointStore(run_folder.RunFolder(config.init_from).checkpoints)
  if store.latest_step() is None:
    raise ConfigError(
        f'config.init_from={config.init_from!r} holds no checkpoint; '
        "point it at a pretraining run's workdir."
    )
  saved = store.restore_config()
  store.close()
  difference = run_config.first_difference(
      saved['model'], config.model.to_dict(), ENCODER_FIELDS, defaults=run_config.MODEL_DEFAULTS
  )
  if difference:
    field, old, new = difference
    raise ConfigError(
        f'config.init_from={config.init_from!r} was trained with '
        f'model.{field}={old!r}, this config has {new!r}; set '
        f'--config.model.{field}={old!r} to fine-tune it, or give the run as the config '
        "file's argument (configs/finetune_sst2.py:RUN) to take every encoder field from it."
    )
  segments = saved['model'].get('num_segments', 0)
  if segments and segments != config.model.num_segments:
    raise ConfigError(
        f'config.init_from={config.init_from!r} has {segments} segment embedding(s), this '
        f'config {config.model.num_segments}; set --config.model.num_segments={segments} to '
        'fine-tune it.'
    )
  saved_data = saved.get('data', {})
  difference = run_config.first_difference(
      saved_data,
      config.data.to_dict(),
      [
          field
          for field in run_config.DATA_FIELDS_FIXED_BY_A_RUN
          if saved_data.get(field) is not None
      ],
  )
  if difference:
    field, old, new = difference
    raise ConfigError(
        f'config.init_from={config.init_from!r} used data.{field}={old!r}, this '
        f'config has {new!r}; set --config.data.{field}={old!r}.'
    )
  return saved['model']


def with_pretrained_encoder(
    state: TrainState, abstract_state: TrainState, init_from: str, saved_model: Dict[str, Any]
) -> Tuple[TrainState, List[str]]:
  """`state` with the encoder (parameters and constants) of run `init_from`.

  The classification head, and encoder parameters the pretrained model lacks
  (FRESH_ENCODER_PARAMS), keep their initial values; their names are returned
  with the new state. `saved_model` is what `check_pretrained_encoder` (call
  it first, for clear errors) returns.
  """
  encoder = dict(abstract_state.params['encoder'])
  fresh = [
      name
      for name, field in FRESH_ENCODER_PARAMS.items()
      if name in encoder and not saved_model.get(field)
  ]
  kept = {name: value for name, value in encoder.items() if name not in fresh}
  encoder_params, encoder_constants = restore_encoder(init_from, kept, abstract_state.constants)
  params = dict(state.params)
  params['encoder'] = {**state.params['encoder'], **encoder_params}
  constants = {collection: dict(variables) for collection, variables in state.constants.items()}
  for collection, value in encoder_constants.items():
    constants[collection]['encoder'] = value
  return state.replace(params=params, constants=constants), fresh


def restore_encoder(
    init_from: str, abstract_params: Dict[str, Any], abstract_constants: Dict[str, Any]
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """The encoder's parameters named in `abstract_params` (the encoder's subtree) and,
  by collection, its constants (of `abstract_constants`, the model's), from run
  `init_from`'s newest checkpoint."""
  subtrees = {('params', 'encoder'): abstract_params}
  for collection, variables in abstract_constants.items():
    if 'encoder' in variables:
      subtrees[('constants', collection, 'encoder')] = variables['encoder']
  restored = partial_restore.restore_subtrees(init_from, subtrees)
  constants = {path[1]: value for path, value in restored.items() if path[0] == 'constants'}
  return restored[('params', 'encoder')], constants
