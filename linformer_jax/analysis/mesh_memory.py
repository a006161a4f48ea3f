"""Per-device memory of the compiled train step on several meshes.

The library of `python -m linformer_jax.mesh_memory`. It compiles (never runs) the train step for each mesh from abstract inputs and
prints XLA's memory analysis per device: the arguments (parameters, optimizer
state and the batch share), the temporaries, and their sum. It helps to choose
`config.mesh_shape`: the 'model' axis is worth raising when the sum does not
fit a device.
"""

from typing import List, Sequence

import jax
import jax.numpy as jnp

from linformer_jax.data import masked_lm
from linformer_jax.model import models
from linformer_jax.training import run_config
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.training import train_steps
from linformer_jax.training import trainer



def train_step_memory(config, mesh_shape: Sequence[int]) -> dict:
  """XLA's per-device memory figures of the train step on one mesh, in bytes."""
  config = config.copy_and_resolve_references()
  config.mesh_shape = tuple(mesh_shape)
  model_config = run_config.validate(config)
  mesh = sharding_lib.create_mesh(config.mesh_shape)
  rules = sharding_lib.axis_rules(config)
  sharding_lib.check_divisibility(model_config, mesh, rules,
                                  batch_size=config.batch_size,
                                  eval_batch_size=config.eval_batch_size)
  model = models.MaskedLanguageModel(model_config)
  optimizer = train_steps.create_optimizer(config)
  abstract_state = trainer.abstract_train_state(model, optimizer,
                                                model_config.max_len, mesh, rules)
  batch_sharding = sharding_lib.batch_sharding(mesh, rules)
  loss_sums = train_steps.masked_lm_loss(
      model, masked_lm.max_predictions(model_config.max_len,
                                            config.data.mask_rate))
  train_step, _ = train_steps.jit_step_functions(
      loss_sums, optimizer, config.grad_accum_steps, state_shardings=trainer.shardings_of(abstract_state),
      batch_sharding=batch_sharding)
  shape = (config.batch_size, model_config.max_len)
  batch = {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
           for name, dtype in (('inputs', jnp.int32), ('targets', jnp.int32),
                               ('weights', jnp.float32), ('padding_mask', jnp.bool_))}
  key = jax.ShapeDtypeStruct((2,), jnp.uint32,
                             sharding=sharding_lib.replicated(mesh))
  analysis = train_step.lower(abstract_state, batch, key).compile().memory_analysis()
  return {'arguments': analysis.argument_size_in_bytes,
          'temporaries': analysis.temp_size_in_bytes,
          'total': analysis.argument_size_in_bytes + analysis.temp_size_in_bytes}
