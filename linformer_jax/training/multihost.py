"""Starting JAX's multi-process runtime on GPU clusters and TPU pods.

One program runs per host (per process); `jax.distributed.initialize` connects
them, after which `jax.devices()` lists the devices of all processes and one
mesh spans them. On a TPU pod slice and under SLURM or Open MPI JAX finds the
coordinator by itself; elsewhere give it as flags or environment variables:

  --coordinator_address=HOST:PORT --num_processes=N --process_id=I
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID

A single process on one machine needs none of this and starts nothing.
"""

import ctypes.util
import importlib.metadata
import os
import re
from typing import Callable, Optional

import jax

from linformer_jax.errors import ConfigError

# Set by a TPU pod slice, SLURM and Open MPI launchers respectively.
_AUTO_DETECTED_CLUSTER_VARIABLES = ('TPU_WORKER_HOSTNAMES', 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE')


def _int_or_none(value, name: str) -> Optional[int]:
  if value in (None, ''):
    return None
  try:
    return int(value)
  except (TypeError, ValueError) as error:
    raise ConfigError(f'{name}={value!r} is not an integer.') from error


def _auto_detected_cluster() -> bool:
  for name in _AUTO_DETECTED_CLUSTER_VARIABLES:
    value = os.environ.get(name, '')
    if name == 'TPU_WORKER_HOSTNAMES' and ',' in value:
      return True
    if name != 'TPU_WORKER_HOSTNAMES' and (_int_or_none(value, name) or 0) > 1:
      return True
  return False


def initialize(
    coordinator_address: str = '',
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    cpu_collectives: str = '',
) -> bool:
  """Connects the processes of a multi-process run; returns whether it did.

  Arguments left empty are read from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES
  and JAX_PROCESS_ID. With none of them set, initializes only on a detected
  cluster (TPU pod slice, SLURM, Open MPI with more than one process).

  Args:
    coordinator_address: HOST:PORT of process 0.
    num_processes: how many processes take part.
    process_id: this process's index, 0 .. num_processes - 1.
    cpu_collectives: for CPU-only clusters, the collectives library ('gloo'
      or 'mpi'); '' keeps JAX's default.
  """
  address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS', '')
  count = (
      num_processes
      if num_processes is not None
      else _int_or_none(os.environ.get('JAX_NUM_PROCESSES'), 'JAX_NUM_PROCESSES')
  )
  index = (
      process_id
      if process_id is not None
      else _int_or_none(os.environ.get('JAX_PROCESS_ID'), 'JAX_PROCESS_ID')
  )
  if cpu_collectives:
    jax.config.update('jax_cpu_collectives_implementation', cpu_collectives)
  if address or count is not None or index is not None:
    if not address or count is None or index is None:
      raise ConfigError(
          'A multi-process run needs all of --coordinator_address, --num_processes '
          f'and --process_id (got {address!r}, {count!r}, {index!r}).'
      )
    if count < 1 or not 0 <= index < count:
      raise ConfigError(
          f'--process_id={index} is not allowed with --num_processes='
          f'{count}; use 0 .. {count - 1}.'
      )
    if count == 1:
      return False
    jax.distributed.initialize(address, count, index)
    return True
  if _auto_detected_cluster():
    jax.distributed.initialize()
    return True
  return False


# The platforms `config.platform` may name, as `jax.default_backend()` names
# them ('gpu' for CUDA and ROCm).
PLATFORMS = ('cpu', 'gpu', 'tpu')
# How each accelerator's JAX is installed (docs/scaling.md).
_INSTALL_HINTS = {
    'gpu': '`make venv-gpu`, or pip install -r requirements-gpu.txt',
    'tpu': '`make venv-tpu`, or pip install -r requirements-tpu.txt',
    'cpu': 'JAX_PLATFORMS=cpu in the environment',
}


def check_platform(expected: str) -> str:
  """Starts JAX's backend and returns its name; a backend other than the
  expected one ('' = any) is a ConfigError saying how to get the right one."""
  if expected and expected not in PLATFORMS:
    raise ConfigError(
        f"config.platform={expected!r} is not a platform; use one of {PLATFORMS} or '' (any)."
    )
  backend = jax.default_backend()
  if expected and backend != expected:
    devices = ', '.join(sorted({device.device_kind for device in jax.devices()}))
    plugin = installed_gpu_plugin() if expected == 'gpu' else None
    if plugin:  # installed, and yet no GPU backend: the plugin could not start
      raise ConfigError(
          f'config.platform={expected!r} but JAX found the {backend} backend ({devices}): '
          f'{plugin} is installed but could not start, since {nvidia_driver_problem()}; '
          f"or set --config.platform={backend} (or '') to run on it."
      )
    raise ConfigError(
        f'config.platform={expected!r} but JAX found the {backend} backend ({devices}): '
        f'install JAX for {expected} ({_INSTALL_HINTS[expected]}), or set '
        f"--config.platform={backend} (or '') to run on it."
    )
  return backend


def installed_gpu_plugin() -> Optional[str]:
  """'jax-cuda12-plugin 0.10.2' where JAX's CUDA plugin is installed, else None."""
  for distribution in importlib.metadata.distributions():
    name = (distribution.metadata['Name'] or '').lower().replace('_', '-')
    if re.fullmatch(r'jax-cuda\d+-plugin', name):
      return f'{name} {distribution.version}'
  return None


def nvidia_driver_problem(
    proc_version: str = '/proc/driver/nvidia/version',
    find_library: Callable[[str], Optional[str]] = ctypes.util.find_library,
) -> str:
  """Why a CUDA plugin may not start here, naming the driver: missing, or the
  version to check against CUDA's needs."""
  try:
    with open(proc_version) as file:
      version = file.readline().strip()
  except OSError:
    version = ''
  if not version and not find_library('cuda'):
    return (
        f'no NVIDIA driver was found (no libcuda.so, no {proc_version}): install the '
        'NVIDIA driver, or run on a machine with a GPU'
    )
  if version:
    return (
        f'the NVIDIA driver here is "{version}" ({proc_version}): CUDA 12 needs 525.60 or '
        "newer and CUDA 13 580 or newer; update the driver, or read JAX's log above"
    )
  return (
      'libcuda.so is found but no driver is loaded (no {proc_version}): load the NVIDIA '
      "kernel module (nvidia-smi shows it), or read JAX's log above"
  ).format(proc_version=proc_version)


def device_summary() -> str:
  """'backend gpu: 8 devices (NVIDIA H100 80GB HBM3), 1 process'."""
  kinds = ', '.join(sorted({device.device_kind for device in jax.devices()}))
  devices, processes = jax.device_count(), jax.process_count()
  return (
      f'backend {jax.default_backend()}: {devices} device{"s" if devices > 1 else ""} '
      f'({kinds}), {processes} process{"es" if processes > 1 else ""}'
  )
