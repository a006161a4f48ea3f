"""A periodic action of one's own in the training loop: the parameters' norm.

The loop (linformer_jax/training/trainer.py) hands every step to its periodic
actions (linformer_jax/training/loop_actions.py); this one writes the
parameters' global L2 norm as the scalar `param_norm` (metrics.jsonl and
TensorBoard) every `every` steps and after the last:

  from configs import tiny
  train_with_parameter_norm(tiny.get_config(), '/tmp/norm', every=5)
"""

import optax

from linformer_jax.training import loop_actions
from linformer_jax.training import trainer


class ParameterNorm(loop_actions.Every):
  """The parameters' L2 norm as a scalar, every `every` steps and after the last."""

  def act(self, done):
    norm = float(optax.tree.norm(done.run.state.params))
    done.logger.write_scalars(done.step, {'param_norm': norm})
    return False


def train_with_parameter_norm(config, workdir, every=100):
  return trainer.train_and_evaluate(
      config, workdir, actions=[ParameterNorm(every, last_step=config.total_steps)]
  )
