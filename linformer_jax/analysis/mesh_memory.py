"""Per-device memory of the compiled train step on several meshes.

The library of `python -m linformer_jax.mesh_memory`. It compiles (never runs)
the train step for a mesh from abstract inputs and returns XLA's memory analysis
per device: the arguments (parameters, optimizer state and the batch share), the
temporaries, and their sum. It helps to choose `config.mesh_shape`: the 'model'
axis is worth raising when the sum does not fit a device.
"""

import time
from typing import Dict, Sequence

import ml_collections

from linformer_jax.training import compiled_step


def train_step_memory(
    config: ml_collections.ConfigDict, mesh_shape: Sequence[int]
) -> Dict[str, float]:
  """XLA's per-device figures of the train step on one mesh: memory in bytes,
  FLOPs per step (its cost analysis) and the compile time in seconds."""
  config = config.copy_and_resolve_references()
  config.mesh_shape = tuple(mesh_shape)
  start = time.monotonic()
  lowered = compiled_step.lowered_train_step(config)
  compiled = lowered.compile()
  compile_seconds = time.monotonic() - start
  analysis = compiled.memory_analysis()
  return {
      'arguments': analysis.argument_size_in_bytes,
      'temporaries': analysis.temp_size_in_bytes,
      'total': analysis.argument_size_in_bytes + analysis.temp_size_in_bytes,
      'flops': compiled_step.step_flops(config, lowered),
      'compile_seconds': compile_seconds,
  }
