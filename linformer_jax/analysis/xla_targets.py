"""Accelerators this host compiles for without having them: TPU slices and H100s.

JAX's plugins (libtpu, the CUDA plugin) describe devices from a name alone, with
no chip or driver: `make xla-targets` installs them into `.xla-targets`, outside
.venv, and `enable_plugins` starts the command again with them on its path. What
is compiled for these devices is analysed (memory, FLOPs), never run. The targets
and the plugins: docs/scaling.md.
"""

import dataclasses
import math
import os
import pathlib
import re
import sys
from typing import Dict, List, Sequence

import jax

from linformer_jax.errors import ConfigError
from linformer_jax.units import GIB

# Where `make xla-targets` installs the plugins; LINFORMER_XLA_TARGETS names another folder.
PLUGIN_FOLDER_ENV = 'LINFORMER_XLA_TARGETS'
DEFAULT_PLUGIN_FOLDER = pathlib.Path(__file__).resolve().parents[2] / '.xla-targets'
# Set in the process `enable_plugins` starts: the plugin folder it put on the path.
_STARTED_WITH_PLUGINS = 'LINFORMER_XLA_TARGETS_ON_PATH'

# An H100 SXM (80 GB HBM3) as XLA:GPU's target description, with the CUDA and
# cuDNN versions the compiler may assume.
H100_TARGET_CONFIG = """
gpu_device_info {
  cuda_compute_capability { major: 9 minor: 0 }
  core_count: 132
  fpus_per_core: 128
  clock_rate_ghz: 1.98
  threads_per_warp: 32
  threads_per_block_limit: 1024
  threads_per_core_limit: 2048
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  device_memory_size: 84929347584
}
platform_name: "CUDA"
runtime_version { major: 12 minor: 8 }
dnn_version_info { major: 9 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
H100_MEMORY_BYTES = int(re.search(r'device_memory_size: (\d+)', H100_TARGET_CONFIG).group(1))
# JAX lets a GPU process allocate this share of the device's memory by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION raises it).
GPU_MEMORY_FRACTION = float(os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', '0.75'))
GPUS_PER_HOST = 8

# TPU generation -> (HBM bytes per chip, whether slice names count TensorCores
# (two per chip) rather than chips).
TPU_CHIPS = {
    'v4': (32 * GIB, True),
    'v5e': (int(15.75 * GIB), False),  # what XLA:TPU reports usable of its 16 GiB
    'v5p': (95 * GIB, True),
    'v6e': (32 * GIB, False),
}


def _by_chips(*shapes: str) -> Dict[int, str]:
  """Slice shapes ('2x4') by their number of chips."""
  return {math.prod(int(side) for side in shape.split('x')): shape for shape in shapes}


# Chips of a slice -> its shape, for 2D (v5e, v6e) and 3D (v4, v5p) tori.
SLICE_SHAPES_2D = _by_chips('1x1', '2x2', '2x4', '4x4', '4x8', '8x8', '8x16', '16x16')
SLICE_SHAPES_3D = _by_chips('2x2x1', '2x2x2', '2x2x4', '2x4x4', '4x4x4', '4x4x8', '4x8x8', '8x8x8')
EXAMPLES = "'v5e-8', 'v6e-4', 'v4-32', 'v5p-64', '2xv5e-8' (two slices), 'h100' or 'h100x8'"


@dataclasses.dataclass(frozen=True)
class Target:
  """An accelerator to compile for."""

  name: str  # as the user gave it ('v5e-8', '2xv5e-8')
  platform: str  # 'tpu' or 'cuda'
  # The slice shape for libtpu ('v5e:2x4'), or GPUs as 'slices x hosts x GPUs per host' ('1x1x8').
  topology: str
  chips: int  # chips (GPUs) in the target, every slice together
  chip_memory_bytes: int  # memory of one chip
  slices: int = 1  # TPU slices joined by the data-centre network (multi-slice)

  def usable_bytes_per_device(self, devices_per_chip: int) -> int:
    """What one JAX device of the target may allocate."""
    share = GPU_MEMORY_FRACTION if self.platform == 'cuda' else 1.0
    return int(self.chip_memory_bytes * share / devices_per_chip)

  def memory_note(self) -> str:
    """Where the usable memory comes from, for reports."""
    if self.platform == 'cuda':
      return (
          f'{GPU_MEMORY_FRACTION:.0%} of {self.chip_memory_bytes / GIB:.1f} GiB per GPU '
          "(JAX's default XLA_PYTHON_CLIENT_MEM_FRACTION)"
      )
    return f'{self.chip_memory_bytes / GIB:.2f} GiB HBM per chip'


def parse_target(name: str) -> Target:
  """The target a name describes, one of the forms of EXAMPLES; a ConfigError for any other."""
  text = name.strip().lower()
  gpu = re.fullmatch(r'h100(?:x(\d+))?', text)
  if gpu:
    count = int(gpu.group(1) or 1)
    if count < 1 or (count > GPUS_PER_HOST and count % GPUS_PER_HOST):
      raise ConfigError(
          f'--target={name!r}: use 1 to {GPUS_PER_HOST} GPUs, or a multiple of {GPUS_PER_HOST} '
          f'(hosts of {GPUS_PER_HOST}).'
      )
    hosts = max(count // GPUS_PER_HOST, 1)
    return Target(name, 'cuda', f'1x{hosts}x{min(count, GPUS_PER_HOST)}', count, H100_MEMORY_BYTES)
  tpu = re.fullmatch(r'(?:(\d+)x)?(v4|v5e|v5p|v6e)-(\d+)', text)
  if not tpu:
    raise ConfigError(f'--target={name!r} is not a target this host compiles for; use {EXAMPLES}.')
  slices, generation, count = int(tpu.group(1) or 1), tpu.group(2), int(tpu.group(3))
  if slices < 1:
    raise ConfigError(f'--target={name!r}: give one slice or more, e.g. 2xv5e-8.')
  memory, counts_cores = TPU_CHIPS[generation]
  chips = count // 2 if counts_cores else count
  shapes = SLICE_SHAPES_3D if generation in ('v4', 'v5p') else SLICE_SHAPES_2D
  if (counts_cores and count % 2) or chips not in shapes:
    sizes = sorted(chips * 2 if counts_cores else chips for chips in shapes)
    raise ConfigError(
        f'--target={name!r}: {generation} slices here have '
        f'{", ".join(str(size) for size in sizes)} {"TensorCores" if counts_cores else "chips"}.'
    )
  return Target(name, 'tpu', f'{generation}:{shapes[chips]}', chips * slices, memory, slices)


def plugin_folder() -> pathlib.Path:
  return pathlib.Path(os.environ.get(PLUGIN_FOLDER_ENV, DEFAULT_PLUGIN_FOLDER))


def enable_plugins(module: str) -> None:
  """Makes this process one whose JAX sees the plugins, JAX on the CPU.

  JAX looks for plugins (and the cuDNN version) when it is imported, so the
  process runs itself again (`python -m module`, the same arguments) with the
  plugin folder on PYTHONPATH and JAX_PLATFORMS=cpu, where this returns at once.

  Raises:
    ConfigError: the folder does not hold the plugins.
  """
  folder = plugin_folder()
  if not (folder / 'jax_plugins').is_dir() or not (folder / 'libtpu').is_dir():
    raise ConfigError(
        f'{folder} does not hold the XLA plugins that compile for GPUs and TPUs; run '
        '`make xla-targets` (or set LINFORMER_XLA_TARGETS to a folder where '
        '`pip install --no-deps --target` installed requirements-xla-targets.txt).'
    )
  if os.environ.get(_STARTED_WITH_PLUGINS) == str(folder):
    return
  environment = {
      **os.environ,
      'PYTHONPATH': os.pathsep.join(filter(None, [str(folder), os.environ.get('PYTHONPATH')])),
      # The host's own devices stay the CPU's; the plugins only describe targets.
      'JAX_PLATFORMS': 'cpu',
      # libtpu takes a lock file that keeps a second process from a TPU; nothing
      # here runs on one, so several analyses may compile at once.
      'ALLOW_MULTIPLE_LIBTPU_LOAD': 'true',
      _STARTED_WITH_PLUGINS: str(folder),
  }
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, '-m', module, *sys.argv[1:]], environment)


def target_devices(target: Target) -> List[jax.Device]:
  """The devices of a target, for a mesh to compile against (`enable_plugins` first)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    if target.platform == 'cuda':
      description = topologies.get_topology_desc(
          target.name, 'cuda', target_config=H100_TARGET_CONFIG, topology=target.topology
      )
    else:
      # One chip is a host of its own (libtpu assumes hosts of 2x2 chips).
      options = {'chips_per_host_bounds': (1, 1, 1)} if target.chips == 1 else {}
      if TPU_CHIPS[target.topology.split(':')[0]][1]:
        # Two TensorCores a chip as one device (megacore), as JAX runs v4 and v5p.
        options['chip_config_name'] = 'megacore'
      description = topologies.get_topology_desc(
          target.topology, platform='tpu', num_slices=target.slices, **options
      )
  except Exception as error:  # the plugin's own error, whatever its type
    raise ConfigError(
        f'XLA could not describe --target={target.name} ({target.topology}): '
        f'{str(error).splitlines()[0][:200]}; run `make xla-targets` to (re)install the plugins.'
    ) from error
  return list(description.devices)


def devices_per_chip(devices: Sequence[jax.Device]) -> int:
  """JAX devices per chip: 2 where each TensorCore is a device of its own (a v4
  outside megacore), else 1."""
  if devices[0].platform != 'tpu':
    return 1
  chips = {(getattr(device, 'slice_index', 0), tuple(device.coords)) for device in devices}
  return max(len(devices) // len(chips), 1)
