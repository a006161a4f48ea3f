"""The Pallas TPU kernel split over a mesh of 4 (fake CPU) devices, for
test_attention_kernels.

  python tests/kernel_partition_worker.py OUT.json

On a (2, 2) ('data', 'model') mesh with the batch and heads split as the
default axis rules split them, it runs `attention.attend_with` with the kernel
inside a shard_map (`attention.PartitionedKernel`) and writes to OUT.json the
largest differences from the einsums on one device: outputs and gradients, a
padded batch, and calls whose batch or heads do not divide over the mesh (which
attend by the einsums). It also records the per-device shapes the lowered
program gives the kernel.

The kernel runs in Pallas's HLO interpret mode (`interpret=True`): the TPU
interpreter (`pltpu.force_tpu_interpret_mode`) simulates every device's
memory through host callbacks that deadlock with several devices in one CPU
process, and the HLO interpreter has no public switch other than
`pallas_call(interpret=True)`, which the kernel does not expose; the context
value below is the switch the kernel's pallas_call reads.
"""

import contextlib
import json
import os
import sys

os.environ['XLA_FLAGS'] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
)
os.environ['JAX_PLATFORMS'] = 'cpu'
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# JAX reads XLA_FLAGS when it is first imported, so these imports come after.
# ruff: noqa: E402
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from jax._src import config as jax_config
import jax.numpy as jnp
import numpy as np

from linformer_jax.model import attention
from linformer_jax.training import sharding

# pylint: enable=g-import-not-at-top,wrong-import-position


@contextlib.contextmanager
def hlo_interpret_mode():
  """Every pallas_call traced inside runs as plain HLO on the CPU."""
  previous = jax_config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
  try:
    yield
  finally:
    jax_config.pallas_tpu_interpret_mode_context_manager.set_local(previous)


def largest_difference(first, second) -> float:
  return float(np.max(np.abs(np.asarray(first, np.float64) - np.asarray(second, np.float64))))


def main(out_path: str) -> None:
  mesh = sharding.create_mesh((2, 2))
  partition = sharding.kernel_partition(mesh, sharding.DEFAULT_AXIS_RULES)
  kernel = attention.PartitionedKernel('pallas', partition)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  results = {'partition': [list(partition.batch_axes), list(partition.heads_axes)]}

  def inputs(batch, heads):
    q = jax.random.normal(keys[0], (batch, 256, heads, 16))  # n = 256 queries
    k, v = (jax.random.normal(key, (batch, 128, heads, 16)) for key in keys[1:])  # k = 128
    lengths = jnp.array([128, 100, 128, 7, 128, 64][:batch])
    return q, k, v, jnp.arange(128)[None, :] < lengths[:, None]

  def loss(attend_fn, mask):
    return lambda *x: jnp.sum(jnp.sin(attend_fn(*x, mask)))

  with hlo_interpret_mode():
    q, k, v, mask = inputs(4, 2)
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data', None, 'model'))
    q, k, v = (jax.device_put(x, split) for x in (q, k, v))
    partitioned = jax.jit(lambda *x: attention.attend_with(kernel, *x))
    out = partitioned(q, k, v, mask)
    grads = jax.jit(jax.grad(loss(lambda *x: attention.attend_with(kernel, *x), mask), (0, 1, 2)))(
        q, k, v
    )
    results['output'] = largest_difference(out, attention.attend(q, k, v, mask))
    expected = jax.grad(loss(attention.attend, mask), (0, 1, 2))(q, k, v)
    results['gradients'] = max(largest_difference(a, b) for a, b in zip(grads, expected))
    results['unmasked'] = largest_difference(
        partitioned(q, k, v, None), attention.attend(q, k, v, None)
    )
    results['output_spec'] = str(out.sharding.spec)
    lowered = partitioned.lower(q, k, v, mask).as_text()
    # Each device's queries: [batch / 2, 256, heads / 2, 16].
    results['manual_computation'] = 'manual_computation' in lowered
    results['per_device_query'] = '%arg4: tensor<2x256x1x16xf32>' in lowered

    # A batch of 3 and 3 heads divide neither mesh axis: the einsums, no kernel.
    q, k, v, mask = inputs(3, 3)
    odd = jax.jit(lambda *x: attention.attend_with(kernel, *x))
    results['odd_shapes'] = largest_difference(odd(q, k, v, mask), attention.attend(q, k, v, mask))
    results['odd_shapes_manual'] = 'manual_computation' in odd.lower(q, k, v, mask).as_text()

  with open(out_path, 'w') as out_file:
    json.dump(results, out_file)


if __name__ == '__main__':
  main(sys.argv[1])
