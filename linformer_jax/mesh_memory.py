"""Per-device memory of the compiled train step on several meshes.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m \
      linformer_jax.mesh_memory --config configs/roberta_base.py \
      --meshes=8,1 --meshes=4,2 --meshes=2,4 --meshes=1,8

Compiles (never runs) the train step for each mesh from abstract inputs and
prints XLA's memory analysis per device: the arguments (parameters, optimizer
state and the batch share), the temporaries, and their sum. It helps to choose
`config.mesh_shape`: the 'model' axis is worth raising when the sum does not
fit a device.
"""

from typing import List

from absl import flags
import jax

from linformer_jax import cli
from linformer_jax.analysis.mesh_memory import train_step_memory

cli.define_config_flags()
flags.FLAGS.set_default('workdir', '')  # nothing is written; --workdir is not needed
_MESHES = flags.DEFINE_multi_string('meshes', ['-1,1'], 'Mesh shapes DATA,MODEL.')
FLAGS = flags.FLAGS
MIB = 2**20


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  print(f'{jax.device_count()} devices; per-device MiB of the compiled train step')
  print('| mesh (data, model) | arguments | temporaries | total | GFLOP per step | compile s |')
  print('|---|---|---|---|---|---|')
  for text in _MESHES.value:
    try:
      mesh_shape = tuple(int(size) for size in text.split(','))
    except ValueError:
      cli.fail(f'--meshes={text!r} is not DATA,MODEL (two ints)')
    memory = train_step_memory(FLAGS.config, mesh_shape)
    print(
        f'| {mesh_shape} | {memory["arguments"] / MIB:.1f} | '
        f'{memory["temporaries"] / MIB:.1f} | {memory["total"] / MIB:.1f} | '
        f'{memory["flops"] / 1e9:,.1f} | {memory["compile_seconds"]:.1f} |',
        flush=True,
    )


if __name__ == '__main__':
  cli.run(main)
