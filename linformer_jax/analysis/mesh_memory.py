"""Per-device memory of the compiled train step on several meshes.

The library of `python -m linformer_jax.mesh_memory`. It compiles (never runs)
the train step for a mesh from abstract inputs and returns XLA's memory analysis
per device: the arguments (parameters, optimizer state and the batch share), the
temporaries, and their sum. It helps to choose `config.mesh_shape`: the 'model'
axis is worth raising when the sum does not fit a device.
"""

from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from linformer_jax.training import run_builder
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.training import train_steps


def train_step_memory(
    config: ml_collections.ConfigDict, mesh_shape: Sequence[int]
) -> Dict[str, int]:
  """XLA's per-device memory figures of the train step on one mesh, in bytes."""
  config = config.copy_and_resolve_references()
  config.mesh_shape = tuple(mesh_shape)
  parts = run_builder.build_parts(config)
  optimizer = train_steps.create_optimizer(config)
  abstract_state = parts.abstract_train_state(optimizer)
  train_step = parts.jit_train_step(optimizer, abstract_state)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=sharding_lib.replicated(parts.mesh))
  compiled = train_step.lower(abstract_state, parts.abstract_batch(), key).compile()
  analysis = compiled.memory_analysis()
  return {
      'arguments': analysis.argument_size_in_bytes,
      'temporaries': analysis.temp_size_in_bytes,
      'total': analysis.argument_size_in_bytes + analysis.temp_size_in_bytes,
  }
