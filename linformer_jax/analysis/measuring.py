"""What the benchmark commands share about measuring one cell: wall times of a
jitted call after a warm-up, random variables of a model's shapes, the notes a
skipped cell gets, the device it ran on, and the training step they time."""

import statistics
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from linformer_jax.model import models
from linformer_jax.training import compiled_step
from linformer_jax.units import GIB


def time_ms(call: Callable[[], Any], repeats: int) -> List[float]:
  """Wall times (ms) of `repeats` calls after one warm-up call."""
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append((time.perf_counter() - start) * 1e3)
  return times


def timing(times: Sequence[float], tokens_per_call: int) -> Dict[str, float]:
  """A cell's time fields: the median, min and max of `times` (ms), and tokens/s at the median."""
  median_ms = statistics.median(times)
  return {
      'time_ms': median_ms,
      'time_min_ms': min(times),
      'time_max_ms': max(times),
      'tokens_per_s': tokens_per_call / (median_ms * 1e-3),
  }


def random_tokens(shape: Tuple[int, ...], vocab_size: int, seed: int) -> jax.Array:
  """Token ids drawn uniformly on the host (int32): the values do not change the work."""
  ids = np.random.default_rng(seed).integers(0, vocab_size, shape, np.int32)
  return jnp.asarray(ids)


def out_of_memory(error: Exception) -> str:
  """'out of memory: ...' (the error's first 200 characters) for a device out of memory;
  raises any other error again."""
  if not compiled_step.is_out_of_memory(error):
    raise error
  return f'out of memory: {" ".join(str(error).split())[:200]}'


def over_limit_note(what: str, planned: Dict[str, int], limit: float) -> str:
  needed = planned['temp_bytes'] + planned['argument_bytes']
  return (
      f'{what} skipped: needs {needed / GIB:.2f} GiB (temp + arguments) > '
      f'limit {limit / GIB:.2f} GiB'
  )


def random_variables(abstract_variables: Any, seed: int) -> Any:
  """Normal(0, 0.02) arrays of the given shapes and dtypes, drawn on the host.

  The values do not change the work of a forward or backward pass, and drawing
  them with numpy avoids compiling the model's initialiser once per cell, which
  takes longer than compiling the forward pass itself.
  """
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda leaf: jnp.asarray(
          (0.02 * rng.standard_normal(leaf.shape, np.float32)).astype(leaf.dtype)
      ),
      nn.meta.unbox(abstract_variables),
  )


def describe_device() -> str:
  """The first device, e.g. 'NVIDIA H100 80GB HBM3 (gpu)'."""
  return f'{jax.devices()[0].device_kind} ({jax.default_backend()})'


def compiled_mlm_train_step(
    config: Any, optimizer: optax.GradientTransformation, tokens: jax.Array, donate: bool = False
) -> Tuple[Any, Any, Any]:
  """The benchmarks' timed training step for `config` (a ModelConfig), compiled for
  `tokens`, with random parameters and their optimizer state to call it with.

  `compiled(params, opt_state, tokens)` is a language-model step predicting every
  token (forward, cross-entropy, backward, update); it returns the updated
  parameters and optimizer state, and the loss. With `donate` it updates them in place.
  """
  model = models.MaskedLanguageModel(config)
  variables = random_variables(jax.eval_shape(model.init, jax.random.key(0), tokens), 1)
  # The fixed arrays beside the parameters ('constants': random projections, a
  # kind's random features) are inputs of the step, never trained.
  fixed = {name: value for name, value in variables.items() if name != 'params'}

  def step(params, opt_state, tokens):
    def loss_fn(p):
      logits = model.apply({'params': p, **fixed}, tokens, deterministic=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = variables['params']
  opt_state = optimizer.init(params)
  jitted = jax.jit(step, donate_argnums=(0, 1) if donate else ())
  return jitted.lower(params, opt_state, tokens).compile(), params, opt_state
