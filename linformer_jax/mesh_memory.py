"""Per-device memory and FLOPs of the compiled train step, on this host or a target.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m \
      linformer_jax.mesh_memory --config configs/roberta_base.py \
      --meshes=8,1 --meshes=4,2 --meshes=2,4 --meshes=1,8

  make xla-targets   # once: XLA's GPU and TPU plugins, into .xla-targets
  python -m linformer_jax.mesh_memory --config configs/roberta_base.py \
      --target=h100 --target=v5e-8 --per_device_batch=8 --max_batch \
      --config.model.max_len=4096 --config.model.projected_len=256

It compiles (never runs) the train step for each mesh over this host's devices or
a target's (`analysis/xla_targets.py`) and prints XLA's memory and FLOPs per
device: docs/scaling.md describes the table, docs/benchmarks.md the search of
--max_batch (`largest_batch`).
"""

import dataclasses
import functools
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import flags
import jax
import ml_collections

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import xla_targets
from linformer_jax.analysis.benchmark_budget import search_batches
from linformer_jax.analysis.tables import markdown_table
from linformer_jax.settings_flags import setting
from linformer_jax.training import compiled_step
from linformer_jax.training import run_config
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.units import GIB
from linformer_jax.units import MIB
from linformer_jax.units import size_text

MAX_SEARCH_COMPILES = 8


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """One compile of the train step; bytes and FLOPs are per device.

  `usable_bytes` is None on this host's CPU (no fixed limit). A step XLA refused
  for lack of memory (`refused`) does not fit; its bytes are what XLA said it
  needs (arguments 0 where XLA named the temporaries only)."""

  per_device_batch: int
  argument_bytes: int
  temporary_bytes: int
  usable_bytes: Optional[int]
  fits: bool
  model_flops: float
  compiled_flops: Optional[float]
  compile_seconds: float
  refused: bool = False

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.temporary_bytes

  def progress_text(self) -> str:
    """'batch 32 per device: fits, 21.68 GiB, compiled in 41.2 s': one line per compile."""
    verdict = 'fits' if self.fits else ('refused by XLA' if self.refused else 'does not fit')
    return (
        f'batch {self.per_device_batch} per device: {verdict}, {size_text(self.total_bytes)}, '
        f'compiled in {self.compile_seconds:.1f} s'
    )

  @property
  def compiler_flops_ratio(self) -> Optional[float]:
    """Compiled over model FLOPs: above 1 where XLA recomputed to fit memory."""
    if not self.compiled_flops or not self.model_flops or not self.fits:
      return None
    return self.compiled_flops / self.model_flops


def compile_step(
    config: ml_collections.ConfigDict,
    mesh_shape: Sequence[int],
    devices: Optional[Sequence[jax.Device]] = None,
    usable_bytes: Optional[int] = None,
    per_device_batch: int = 0,
) -> StepMemory:
  """Compiles the step of `config` on a mesh of `devices` (default: this
  host's) with `per_device_batch` rows per data shard (0: config.batch_size)."""
  devices = list(devices) if devices is not None else jax.devices()
  config = config.copy_and_resolve_references()
  config.mesh_shape = tuple(mesh_shape)
  data, _ = sharding_lib.resolve_mesh_shape(config.mesh_shape, len(devices))
  if per_device_batch:
    config.batch_size = per_device_batch * data
    config.grad_accum_steps = 1
  batch = config.batch_size // data
  settings = run_config.RunConfig.from_config(config)
  flops = compiled_step.host_step_flops(settings, len(devices))
  start = time.monotonic()
  try:
    compiled = compiled_step.lowered_train_step(settings, devices).compile()
  except jax.errors.JaxRuntimeError as error:
    need = compiled_step.out_of_memory_need(error)
    if need is None:
      raise
    return StepMemory(
        batch, *need, usable_bytes, False, flops, None, time.monotonic() - start, refused=True
    )
  seconds = time.monotonic() - start
  memory = compiled_step.planned_bytes(compiled)
  arguments, temporaries = memory['argument_bytes'], memory['temp_bytes']
  compiled_flops = None
  # XLA's cost analysis counts a loop's body once: the micro-batch loop holds all
  # of a step's work but the update; a scan over layers has no such fix.
  if devices[0].platform == 'tpu' and not config.model.scan_layers:
    micro_batch_flops = compiled_step.cost_analysis(compiled)['flops'] or 0.0
    compiled_flops = micro_batch_flops * config.grad_accum_steps or None
  fits = usable_bytes is None or arguments + temporaries <= usable_bytes
  return StepMemory(
      batch, arguments, temporaries, usable_bytes, fits, flops, compiled_flops, seconds
  )


def largest_batch(
    measure: Callable[[int], StepMemory], first: StepMemory
) -> Dict[str, Optional[float]]:
  """The largest per-device batch whose step fits, from `measure(batch)` (`first`: one
  compile already made) in at most MAX_SEARCH_COMPILES compiles, searched from the batch
  that a line memory = fixed + batch x per_sequence through two batches predicts.

  Returns:
    'batch' (0 if one sequence does not fit), 'exact' (False where the compiles ran
    out first: 'batch' is then a floor), 'bytes_per_sequence' (the slope; None if it
    could not be measured), 'total_bytes' at that batch and 'compiles'.
  """
  results = {first.per_device_batch: first}

  def at(batch: int) -> StepMemory:
    if batch not in results:
      results[batch] = measure(batch)
    return results[batch]

  def found(batch: int, exact: bool, slope: Optional[float]) -> Dict[str, Optional[float]]:
    return {
        'batch': batch,
        'exact': exact,
        'bytes_per_sequence': slope,
        'total_bytes': at(batch).total_bytes if batch else None,
        'compiles': len(results),
    }

  batch = first.per_device_batch
  while not at(batch).fits and batch > 1:
    batch = max(batch // 2, 1)
  if not at(batch).fits:
    return found(0, True, None)
  base, doubled = at(batch), at(2 * batch)
  # A step XLA refused reports its temporaries only; its arguments are about the base's.
  doubled_total = doubled.total_bytes + (0 if doubled.argument_bytes else base.argument_bytes)
  slope = (doubled_total - base.total_bytes) / batch
  predicted = batch + 1
  if slope > 0:
    predicted = max(int((base.usable_bytes - (base.total_bytes - slope * batch)) // slope), 1)
  low = max(known for known, memory in results.items() if memory.fits)
  above = [known for known, memory in results.items() if not memory.fits and known > low]
  high = min(above) if above else None  # the smallest batch known not to fit
  probe = predicted if low < predicted and (high is None or predicted < high) else low + 1
  grow = lambda low: low + 1 if low == predicted else 2 * low  # past the prediction: 1, then x2
  more_calls = lambda: len(results) < MAX_SEARCH_COMPILES
  start, step = low, [1]

  def narrow(low: int, high: int) -> int:
    # The line is off by a few sequences where it misses: below a miss, step
    # down 1, 2, 4, ... until a batch fits, then bisect.
    if low > start:
      return (low + high) // 2
    step[0] *= 2
    return max(high - step[0] // 2, (low + high) // 2)

  low, high = search_batches(
      lambda batch: at(batch).fits, low, high, probe, grow, more_calls, narrow
  )
  return found(low, high == low + 1, slope if slope > 0 else None)


def _gflop(flops: float) -> str:
  gflop = flops / 1e9
  return f'{gflop:,.1f}' if gflop >= 1 else f'{gflop:.3g}'


def _row_cells(target: str, mesh: Sequence[int], memory: StepMemory) -> Dict[str, object]:
  """The table's cells of one compile, by column."""
  refused = memory.refused and not memory.argument_bytes
  ratio = memory.compiler_flops_ratio
  return {
      'target': target,
      'mesh (data, model)': tuple(mesh),
      'batch per device': memory.per_device_batch,
      'arguments': '-' if refused else size_text(memory.argument_bytes),
      'temporaries': f'{"needs " if memory.refused else ""}{size_text(memory.temporary_bytes)}',
      'total': size_text(memory.total_bytes),
      'usable': size_text(memory.usable_bytes) if memory.usable_bytes else 'host',
      'fits': 'yes' if memory.fits else 'no',
      'model GFLOP per device': _gflop(memory.model_flops),
      'compiled / model FLOPs': f'{ratio:.3f}' if ratio else '-',
      'compile s': f'{memory.compile_seconds:.1f}',
  }


def describe_rows(rows: List[Dict[str, object]]) -> str:
  """A markdown table of one or more rows {'target', 'mesh', 'memory': StepMemory}."""
  cells = [_row_cells(**row) for row in rows]
  return markdown_table(list(cells[0]), [list(row_cells.values()) for row_cells in cells])


def _largest_batch_text(found: Dict[str, Optional[float]]) -> str:
  """'largest batch per device that fits: 30 (2.10 GiB); 300 MiB per sequence; 5 compiles'."""
  per_sequence = found['bytes_per_sequence']
  return (
      f'largest batch per device that fits: {"" if found["exact"] else "at least "}{found["batch"]}'
      + (f' ({found["total_bytes"] / GIB:.2f} GiB)' if found['batch'] else '')
      + (f'; {per_sequence / MIB:,.0f} MiB per sequence' if per_sequence else '')
      + f'; {found["compiles"]} compiles'
  )


@dataclasses.dataclass(frozen=True)
class MeshMemorySettings:
  meshes: Sequence[str] = setting(('-1,1',), 'Mesh shapes DATA,MODEL.', repeated=True)
  target: Sequence[str] = setting(
      (),
      f'Compile for these accelerators instead of this host: {xla_targets.EXAMPLES}.',
      repeated=True,
  )
  per_device_batch: int = setting(
      0, "Sequences per data shard (0: the config's batch_size over the mesh)."
  )
  max_batch: bool = setting(
      False, 'Also find the largest batch per device that fits (needs --target).'
  )


def define_flags() -> None:
  cli.define_config_flags(writes=False)
  settings_flags.define_flags(MeshMemorySettings)


def _mesh_shapes(settings: MeshMemorySettings) -> List[tuple]:
  shapes = []
  for text in settings.meshes:
    try:
      shape = tuple(int(size) for size in text.split(','))
    except ValueError:
      shape = ()
    if len(shape) != 2:
      cli.fail(f'--meshes={text!r} is not DATA,MODEL (two ints)')
    shapes.append(shape)
  return shapes


def _kernel_text(devices: Sequence[jax.Device]) -> str:
  """'attention kernel cudnn (auto: ...)': what the step takes on `devices`."""
  model = run_config.RunConfig.from_config(flags.FLAGS.config).model
  resolved, why = model.with_kernel_for(devices[0].platform)
  return f'attention kernel {resolved.attention_kernel} ({why})'


def _places(target_names: Sequence[str]) -> List[Tuple[str, List[jax.Device], Optional[int]]]:
  """(name, devices, usable bytes per device) of each target, or of this host
  without targets; prints a line on each."""
  if not target_names:
    devices = jax.devices()
    print(f'host: {len(devices)} x {devices[0].device_kind}; {_kernel_text(devices)}', flush=True)
    return [('host', devices, None)]
  targets = [xla_targets.parse_target(name) for name in target_names]  # before the restart
  xla_targets.enable_plugins('linformer_jax.mesh_memory')
  places = []
  for target in targets:
    devices = xla_targets.target_devices(target)
    usable = target.usable_bytes_per_device(xla_targets.devices_per_chip(devices))
    print(
        f'{target.name}: {len(devices)} x {devices[0].device_kind} '
        f'({target.topology}{f" x {target.slices} slices" if target.slices > 1 else ""}), '
        f'usable {usable / GIB:.2f} GiB per device '
        f'({target.memory_note()}); {_kernel_text(devices)}',
        flush=True,
    )
    places.append((target.name, devices, usable))
  return places


def _measure(name: str, mesh_shape, devices, usable: Optional[int], batch: int) -> StepMemory:
  """One compile, with its progress line on stderr."""
  memory = compile_step(flags.FLAGS.config, mesh_shape, devices, usable, per_device_batch=batch)
  print(f'{name} {mesh_shape}: {memory.progress_text()}', file=sys.stderr, flush=True)
  return memory


def main(_: List[str]) -> None:
  settings = settings_flags.from_flags(MeshMemorySettings)
  if settings.per_device_batch < 0:
    cli.fail(f'--per_device_batch={settings.per_device_batch} must be 0 or more')
  if settings.max_batch and not settings.target:
    cli.fail('--max_batch needs a --target with a fixed memory size (this host has none)')
  meshes = _mesh_shapes(settings)
  rows = []
  for name, devices, usable in _places(settings.target):
    for mesh_shape in meshes:
      measure = functools.partial(_measure, name, mesh_shape, devices, usable)
      memory = measure(settings.per_device_batch)
      rows.append({'target': name, 'mesh': mesh_shape, 'memory': memory})
      if settings.max_batch:
        found = largest_batch(measure, memory)
        print(f'{name} {mesh_shape}: {_largest_batch_text(found)}', flush=True)
  print(describe_rows(rows))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
