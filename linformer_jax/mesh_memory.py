"""Per-device memory and FLOPs of the compiled train step, here or on a GPU/TPU target.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m \
      linformer_jax.mesh_memory --config configs/roberta_base.py \
      --meshes=8,1 --meshes=4,2 --meshes=2,4 --meshes=1,8

  make xla-targets   # once: XLA's GPU and TPU plugins, into .xla-targets
  python -m linformer_jax.mesh_memory --config configs/roberta_base.py \
      --target=h100 --target=v5e-8 --per_device_batch=8 --max_batch \
      --config.model.max_len=4096 --config.model.projected_len=256

Compiles (never runs) the train step for each mesh from abstract inputs and
prints XLA's analyses per device: the arguments (parameters, optimizer state
and the batch share), the temporaries, their sum against the usable memory,
the model's TFLOPs and, on TPU, the compiled program's FLOPs over the model's
(above 1 where XLA:TPU rematerialised on its own to fit HBM). Without
--target it compiles for this host's devices; with --target for a TPU slice
('v5e-8', 'v6e-4', 'v4-32', 'v5p-64') or H100s ('h100', 'h100x8') that this
host does not have (analysis/xla_targets.py). --max_batch also finds the
largest batch per device that fits, and the memory per sequence.
"""

from typing import List

from absl import flags
import jax

from linformer_jax import cli
from linformer_jax.analysis import mesh_memory
from linformer_jax.analysis import xla_targets
from linformer_jax.units import GIB
from linformer_jax.units import MIB

cli.define_config_flags()
flags.FLAGS.set_default('workdir', '')  # nothing is written; --workdir is not needed
_MESHES = flags.DEFINE_multi_string('meshes', ['-1,1'], 'Mesh shapes DATA,MODEL.')
_TARGETS = flags.DEFINE_multi_string(
    'target', [], f'Compile for these accelerators instead of this host: {xla_targets.EXAMPLES}.'
)
_PER_DEVICE_BATCH = flags.DEFINE_integer(
    'per_device_batch', 0, "Sequences per data shard (0: the config's batch_size over the mesh)."
)
_MAX_BATCH = flags.DEFINE_bool(
    'max_batch', False, 'Also find the largest batch per device that fits (needs --target).'
)
FLAGS = flags.FLAGS


def _mesh_shapes() -> List[tuple]:
  shapes = []
  for text in _MESHES.value:
    try:
      shapes.append(tuple(int(size) for size in text.split(',')))
    except ValueError:
      cli.fail(f'--meshes={text!r} is not DATA,MODEL (two ints)')
    if len(shapes[-1]) != 2:
      cli.fail(f'--meshes={text!r} is not DATA,MODEL (two ints)')
  return shapes


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  if _PER_DEVICE_BATCH.value < 0:
    cli.fail(f'--per_device_batch={_PER_DEVICE_BATCH.value} must be 0 or more')
  if _MAX_BATCH.value and not _TARGETS.value:
    cli.fail('--max_batch needs a --target with a fixed memory size (this host has none)')
  meshes = _mesh_shapes()
  targets = [xla_targets.parse_target(name) for name in _TARGETS.value]  # checked first
  if targets:
    xla_targets.enable_plugins('linformer_jax.mesh_memory')
    places = []
    for target in targets:
      devices, usable = mesh_memory.target_devices(target)
      places.append((target.name, devices, usable))
      print(
          f'{target.name}: {len(devices)} x {devices[0].device_kind} '
          f'({target.topology}), usable {usable / GIB:.2f} GiB per device '
          f'({target.memory_note()})',
          flush=True,
      )
  else:
    places = [('host', jax.devices(), None)]
    print(f'host: {jax.device_count()} x {jax.devices()[0].device_kind}', flush=True)
  rows, searches = [], []
  for name, devices, usable in places:
    for mesh_shape in meshes:

      def measure(batch, mesh_shape=mesh_shape, devices=devices, usable=usable):
        return mesh_memory.compile_step(
            FLAGS.config, mesh_shape, devices, usable, per_device_batch=batch
        )

      memory = measure(_PER_DEVICE_BATCH.value)
      rows.append({'target': name, 'mesh': mesh_shape, 'memory': memory})
      if _MAX_BATCH.value:
        found = mesh_memory.largest_batch(measure, memory)
        per_sequence = found['bytes_per_sequence']
        searches.append(
            f'{name} {mesh_shape}: largest batch per device that fits: '
            f'{"" if found["exact"] else "at least "}{found["batch"]}'
            + (f' ({found["total_bytes"] / GIB:.2f} GiB)' if found['batch'] else '')
            + (f'; {per_sequence / MIB:,.0f} MiB per sequence' if per_sequence else '')
            + f'; {found["compiles"]} compiles'
        )
        print(searches[-1], flush=True)
  print(mesh_memory.describe_rows(rows))


if __name__ == '__main__':
  cli.run(main)
