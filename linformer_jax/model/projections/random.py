"""'random': fixed random matrices E and F, drawn once and never trained.

Drawn as the 'linear' projection's (entries from N(0, 1/k)), they live in the
'constants' collection, outside 'params', so no gradient or optimizer update
ever reaches them while they are still saved with the model's variables.
Everything else is the 'linear' projection's, but the initialisation: a
fixed 'local' or 'xavier' matrix would not be the random projection this
kind stands for, so it takes only projection_init='jl'.
"""

import jax.numpy as jnp

from linformer_jax.model.projections.base import CONSTANTS
from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.linear import LearnedMatrix


@REGISTRY.register('random')
class FixedRandomMatrix(LearnedMatrix):
  """Untrained random matrices; see the module docstring."""

  projection_inits = ('jl',)

  def make_weight(self, module, name, *, config, projected_len, per_head):
    shape, init = self.matrix_init(config=config, projected_len=projected_len, per_head=per_head)
    return module.variable(
        CONSTANTS, name, lambda: init(module.make_rng('params'), shape, jnp.float32)
    ).value
