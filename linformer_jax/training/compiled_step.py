"""The train step compiled before the first step: its memory and its FLOPs.

A run compiles its train step ahead of time (`compile_train_step`) and then
calls the compiled executable. XLA's analyses of that executable give:

- the memory a device needs (arguments, the state and a batch, plus
  temporaries), compared with what the device has before anything runs: a step
  that cannot fit stops the run with one line saying what to change;
- the FLOPs a device runs per step (`step_flops`: XLA's cost analysis of the
  lowered step, recomputation included, over the devices), from which the
  progress line reports TFLOP/s per device and FLOPs utilisation (MFU)
  against the device's peak bfloat16 rate, where the device is in
  `PEAK_BF16_FLOPS`. On a CPU there is no such peak: MFU is left out.

An out-of-memory error raised while the step compiles or runs gets a
one-line message too (`memory_budget.out_of_memory_message`).

The readings of XLA's analyses live here once, for the run and for every
analysis command: `cost_analysis` (FLOPs, bytes accessed), `planned_bytes`
(the memory a compiled program plans), `is_out_of_memory` and
`out_of_memory_need` (what XLA:TPU said a step it refused needs); what a
device has, and the state's share of it, in `memory_budget`.
"""

import dataclasses
import re
from typing import Any, Dict, Optional, Sequence, Tuple

import jax

from linformer_jax.errors import ConfigError
from linformer_jax.training import memory_budget
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.training.memory_budget import device_memory_bytes
from linformer_jax.training.memory_budget import is_out_of_memory
from linformer_jax.training.run_config import RunConfig
from linformer_jax.units import GIB
from linformer_jax.units import KIB
from linformer_jax.units import MIB
from linformer_jax.units import TIB
from linformer_jax.units import size_text

# XLA:TPU's refusals: '... HLO temporaries (29.90G) exceeds available HBM
# (15.75G).', or '... Exceeded hbm capacity by 2.56M.' with a breakdown that
# names 'program 14.47G' and 'arguments 1.28G'.
_SIZE = r'([\d.]+)([KMGT])'
_TEMPORARIES_EXCEED = re.compile(r'temporaries \(' + _SIZE + r'\) exceeds available HBM')
_PROGRAM = re.compile(r'^\s*program\s+' + _SIZE, re.MULTILINE)
_ARGUMENTS = re.compile(r'^\s*arguments\s+' + _SIZE, re.MULTILINE)
_UNITS = {'K': KIB, 'M': MIB, 'G': GIB, 'T': TIB}

# Dense bfloat16 peak FLOP/s per device, by a substring of `device.device_kind`
# (first match wins): NVIDIA's and Google's published figures, without sparsity.
PEAK_BF16_FLOPS = (
    ('H100', 989e12),  # H100 SXM; the PCIe card peaks at 756e12
    ('H200', 989e12),
    ('A100', 312e12),
    ('TPU v6 lite', 918e12),  # v6e
    ('TPU v5 lite', 197e12),  # v5e
    ('TPU v5', 459e12),  # v5p
    ('TPU v4', 275e12),
)


def peak_flops(device_kind: str) -> Optional[float]:
  """The device's peak bfloat16 FLOP/s, or None if it is not in the table."""
  for name, flops in PEAK_BF16_FLOPS:
    if name in device_kind:
      return flops
  return None


def peak_device_bytes() -> Optional[int]:
  """The most memory any local accelerator has held since the process began
  (its allocator's `peak_bytes_in_use`), or None on CPUs."""
  peaks = [
      int(stats['peak_bytes_in_use'])
      for device in jax.local_devices()
      if device.platform != 'cpu'
      for stats in [device.memory_stats()]
      if stats and 'peak_bytes_in_use' in stats
  ]
  return max(peaks) if peaks else None


@dataclasses.dataclass(frozen=True)
class StepCost:
  """What one device needs for one compiled train step."""

  argument_bytes: int
  temporary_bytes: int
  flops: float  # per device per step; 0 where XLA gives no cost analysis
  # Of the arguments, the bytes the run's state already holds in the host's
  # memory (on CPU devices; 0 on accelerators): `device_memory_bytes` reads
  # the host's available memory with them already taken out.
  held_bytes: int = 0

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.temporary_bytes

  def describe(self) -> str:
    """'per device 1.3 MiB (arguments 0.3 MiB, temporaries 1.0 MiB), 0.0169 GFLOP per step'."""
    return (
        f'per device {size_text(self.total_bytes)} (arguments {size_text(self.argument_bytes)}, '
        f'temporaries {size_text(self.temporary_bytes)}), {self.flops / 1e9:.3g} GFLOP per step'
    )


def lowered_train_step(
    settings: RunConfig, devices: Optional[Sequence[jax.Device]] = None
) -> jax.stages.Lowered:
  """The train step of a run of `settings`, lowered for its mesh from
  abstract inputs (nothing is compiled or run: for analyses of any config on
  any host).

  The mesh spans `devices`, by default JAX's; the devices of an accelerator
  topology (`analysis.xla_targets`) give a program that compiles for it."""
  parts = run_builder.parts_of(settings, devices)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  abstract_state = parts.abstract_train_state(optimizer)
  train_step = parts.jit_train_step(optimizer, abstract_state)
  # The trainer's raw key: (2,) under threefry, (4,) under JAX_DEFAULT_PRNG_IMPL=rbg.
  key_shape = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  key = jax.ShapeDtypeStruct(
      key_shape.shape, key_shape.dtype, sharding=sharding_lib.replicated(parts.mesh)
  )
  return train_step.lower(abstract_state, parts.abstract_batch(), key)


def compile_train_step(run: Any, dropout_key: jax.Array) -> Tuple[Any, StepCost]:
  """Compiles `run.train_step` for the run's state, batch and key; returns the
  executable and its cost per device.

  Raises:
    ConfigError: XLA ran out of memory compiling the step (XLA:TPU refuses a
      step that cannot fit), in one line.
  """
  key = jax.ShapeDtypeStruct(dropout_key.shape, dropout_key.dtype)
  batch = run.parts.abstract_batch()
  lowered = run.train_step.lower(run.abstract_state, batch, key)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as error:
    message = memory_budget.out_of_memory_message(error, run.parts.settings)
    if message is None:
      raise
    raise ConfigError(message) from None
  memory = planned_bytes(compiled)
  on_host = jax.local_devices()[0].platform == 'cpu'
  return compiled, StepCost(
      argument_bytes=memory['argument_bytes'],
      temporary_bytes=memory['temp_bytes'],
      flops=step_flops(
          run.parts.settings, lowered, attention_kernel=run.parts.model_config.attention_kernel
      ),
      held_bytes=memory_budget.state_bytes(run.abstract_state).state if on_host else 0,
  )


def cost_analysis(program: Any) -> Dict[str, Optional[float]]:
  """XLA's cost analysis of a lowered or compiled program: 'flops' and
  'bytes_accessed', None where XLA reports none."""
  analysis = program.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # one entry per program in older jax
    analysis = analysis[0] if analysis else None
  analysis = analysis or {}
  return {
      column: float(analysis[key]) if key in analysis else None
      for column, key in (('flops', 'flops'), ('bytes_accessed', 'bytes accessed'))
  }


def planned_bytes(compiled: Any) -> Dict[str, int]:
  """XLA's planned temporary, argument, output and aliased (updated in place)
  bytes of a compiled program; 0 where a backend plans none."""
  memory = compiled.memory_analysis()
  return {
      name: int(getattr(memory, field)) if memory else 0
      for name, field in (
          ('temp_bytes', 'temp_size_in_bytes'),
          ('argument_bytes', 'argument_size_in_bytes'),
          ('output_bytes', 'output_size_in_bytes'),
          ('alias_bytes', 'alias_size_in_bytes'),
      )
  }


# Attention kernels that are one opaque call to XLA's cost analysis, and run
# on one kind of accelerator only: their steps are counted on the host.
OPAQUE_KERNELS = ('cudnn', 'pallas')


def step_flops(
    settings: RunConfig,
    lowered: Any,
    devices: Optional[Sequence[jax.Device]] = None,
    *,
    attention_kernel: str = 'einsum',
) -> float:
  """FLOPs one device runs per step of the lowered train step of a run of
  `settings`.

  XLA's cost analysis of the lowered program (before XLA's own rewrites;
  recomputation by `model.remat` included), over the devices. It counts a
  loop's body once: the step's loop over micro-batches holds all of its work
  but the optimizer update, so the figure is scaled by grad_accum_steps; and
  scanned layers are analysed as the same step with a Python loop over them.
  `devices` are those the step was lowered for (by default JAX's), and
  `attention_kernel` the kernel it attends with. Where that analysis counts
  nothing (XLA:GPU gives none for a lowered program) or cannot see inside the
  attention (cuDNN's and the Pallas kernels are opaque calls), the step is counted on this
  host's CPU instead (`host_step_flops`).
  """
  device_count = len(devices) if devices is not None else jax.device_count()
  if attention_kernel in OPAQUE_KERNELS:
    return host_step_flops(settings, device_count)
  if settings.model.scan_layers:
    unscanned = dataclasses.replace(settings.model, scan_layers=False)
    lowered = lowered_train_step(dataclasses.replace(settings, model=unscanned), devices)
  flops = cost_analysis(lowered)['flops']
  if not flops:
    return host_step_flops(settings, device_count)
  return flops * settings.loop.grad_accum_steps / device_count


def host_step_flops(settings: RunConfig, device_count: int) -> float:
  """FLOPs per device of the step of a run of `settings` as the model defines
  it, counted on this host's CPU: the same global batch on one CPU device,
  with the einsum attention (the same products as a fused kernel), over
  `device_count`."""
  model = dataclasses.replace(settings.model, scan_layers=False, kernel_partition=None)
  if model.attention_kernel in OPAQUE_KERNELS + ('auto',):
    model = dataclasses.replace(model, attention_kernel='einsum')
  host = dataclasses.replace(
      settings, model=model, mesh=dataclasses.replace(settings.mesh, mesh_shape=(1, 1))
  )
  cpu = jax.devices('cpu')[:1]
  lowered = lowered_train_step(host, cpu)
  return (cost_analysis(lowered)['flops'] or 0.0) * settings.loop.grad_accum_steps / device_count


def check_fits(cost: StepCost, settings: RunConfig) -> None:
  """A ConfigError if one step needs more memory than a device has (the
  state it already holds on the host counted as there: `StepCost.held_bytes`)."""
  available, source = device_memory_bytes(jax.local_devices()[0])
  available += cost.held_bytes
  held = f", the run's state ({size_text(cost.held_bytes)}) included" if cost.held_bytes else ''
  if cost.total_bytes > available:
    raise ConfigError(
        f'The train step needs {cost.total_bytes / GIB:.2f} GiB per device (arguments '
        f'{cost.argument_bytes / GIB:.2f}, temporaries {cost.temporary_bytes / GIB:.2f}) '
        f'but {available / GIB:.2f} GiB is there ({source}){held}: '
        f'{memory_budget.what_to_change(settings, step=True, model=False)}.'
    )


def _bytes(match: Optional[re.Match]) -> int:
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else 0


def out_of_memory_need(error: BaseException) -> Optional[Tuple[int, int]]:
  """(arguments, temporaries) XLA:TPU said a refused step needs, or None if
  the error is not such a refusal."""
  if not is_out_of_memory(error):
    return None
  text = str(error)
  exceeded = _TEMPORARIES_EXCEED.search(text)
  if exceeded:
    return 0, _bytes(exceeded)
  program = _PROGRAM.search(text)
  if program:
    return _bytes(_ARGUMENTS.search(text)), _bytes(program)
  return None


def out_of_memory_error(error: BaseException, settings: RunConfig) -> ConfigError:
  """The one-line error for an out-of-memory error raised while running a run
  of `settings` (`memory_budget.out_of_memory_message`)."""
  return ConfigError(memory_budget.out_of_memory_message(error, settings))
