"""'random': fixed random matrices E and F, drawn once and never trained.

Drawn as the 'linear' projection's (entries from N(0, 1/k)), they live in the
'constants' collection, outside 'params', so no gradient or optimizer update
ever reaches them while they are still saved with the model's variables.
Everything else is the 'linear' projection's, but the initialisation: a
fixed 'local' or 'xavier' matrix would not be the random projection this
kind stands for, so it takes only projection_init='jl'.
"""

from linformer_jax.model.declarations import Constant
from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.linear import LearnedMatrix


@REGISTRY.register('random')
class FixedRandomMatrix(LearnedMatrix):
  """Untrained random matrices; see the module docstring."""

  projection_inits = ('jl',)

  def weight(self, *, config, projected_len, per_head):
    # The learned matrix's shape, draw and logical axes, in 'constants'.
    matrix = super().weight(config=config, projected_len=projected_len, per_head=per_head)
    return Constant(matrix.shape, matrix.init, matrix.axes)
