"""The weights a part declares, for the layer to create: `Parameter` and `Constant`.

An attention kind (`AttentionKind.parameters`, `constants`) and a sequence
projection kind (`SequenceProjectionKind.weight`) say what they hold, its
shape, initialiser and logical axes; the layers of `linformer_jax.model.layers`
create it in the model, float32, and hand its value back. No part touches a
Flax module.
"""

from typing import Callable, NamedTuple, Optional, Tuple

import jax

Array = jax.Array

# Variable collection of weights that are saved with the model but never
# trained (no gradient or optimizer update reaches them).
CONSTANTS = 'constants'


class Parameter(NamedTuple):
  """A learned parameter each layer of a kind holds.

  Attributes:
    shape: its shape, e.g. (config.num_heads,).
    init: an initializer, (key, shape, dtype) -> array
      (`jax.nn.initializers`); the parameter is float32.
    axes: one logical axis name per dimension
      (`linformer_jax.model.logical_axes`), by which `config.axis_rules`
      shards it; a name that no rule maps is replicated.
    learning_rate_scale: its updates times this (a finite number >= 0):
      its learning rate and its decoupled weight decay scaled, 0 freezing it
      at its initial value. An attention kind's only: a projection's weights
      take config.model.projection_learning_rate_scale.
    weight_decay: True decays it, False never does; None (the default)
      follows the optimizer's rule for every weight, which decays matrices
      and leaves vectors and scalars alone. An attention kind's only, as
      `learning_rate_scale`.
  """

  shape: Tuple[int, ...]
  init: Callable[..., Array]
  axes: Tuple[str, ...]
  learning_rate_scale: float = 1.0
  weight_decay: Optional[bool] = None


class Constant(NamedTuple):
  """A fixed array each layer of a kind holds, drawn once, never trained.

  It lives in the 'constants' collection (`CONSTANTS`), outside 'params': no
  gradient, optimizer update or weight decay reaches it, while checkpoints
  save it with the parameters, so a restored run has the very values it
  trained with.

  Attributes:
    shape: its shape, e.g. (features, config.head_dim).
    init: an initializer, (key, shape, dtype) -> array, called once when
      the model is initialised, with a key of the 'params' stream (so the
      draw follows the run's seed, and differs from layer to layer); the
      array is float32.
    axes: one logical axis name per dimension, as a `Parameter`'s; None (the
      default) replicates it on a mesh.
  """

  shape: Tuple[int, ...]
  init: Callable[..., Array]
  axes: Optional[Tuple[str, ...]] = None
