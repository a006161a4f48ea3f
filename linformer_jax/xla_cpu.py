"""The XLA:CPU setting every entry point starts with: no YNNPACK library fusions.

jaxlib 0.10's XLA:CPU hands matrix products, with the element-wise work and
reductions around them, to the YNNPACK library as opaque "ynn fusions". On
this project's CPUs that costs memory accounting and speed (measured side by
side in docs/benchmarks.md, "XLA:CPU's library fusions"):

- a ynn fusion allocates its intermediates itself, outside XLA's buffer
  assignment, so `compiled.memory_analysis()` does not count them, and the
  benchmark's memory columns and its memory-budget method read that analysis;
- YNNPACK runs a product whose right operand is transposed, as in a training
  step's backward pass, slower than the same product untransposed.

`without_library_fusions(XLA_FLAGS)` adds
`--xla_cpu_experimental_ynn_fusion_type=` (an empty list: none) unless the
flags already set it, so a user who wants the fusions back passes the flag
with a list, e.g. `+dot` for jaxlib's default. XLA reads XLA_FLAGS when JAX
starts its first backend, so it must be set before any computation, that is
before JAX says which backend it found: `cpu_is_the_backend` tells from the
environment (JAX_PLATFORMS, or no accelerator plugin installed), and a
command's process sets CPU flags only then (command_process.py).
"""

import importlib.util
import os

# The packages that give JAX an accelerator backend (requirements-gpu.txt,
# requirements-tpu.txt).
ACCELERATOR_PACKAGES = ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'libtpu')


def cpu_is_the_backend() -> bool:
  """Whether JAX will pick the CPU: JAX_PLATFORMS names it first, or, without
  JAX_PLATFORMS, no accelerator plugin is installed."""
  platforms = os.environ.get('JAX_PLATFORMS', '').strip()
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  return not any(importlib.util.find_spec(package) for package in ACCELERATOR_PACKAGES)


LIBRARY_FUSIONS_FLAG = '--xla_cpu_experimental_ynn_fusion_type'


def without_library_fusions(xla_flags: str) -> str:
  """XLA_FLAGS turning YNNPACK fusions off, unless `xla_flags` already chooses."""
  if LIBRARY_FUSIONS_FLAG in xla_flags:
    return xla_flags
  return f'{xla_flags} {LIBRARY_FUSIONS_FLAG}='.strip()


def disable_library_fusions() -> None:
  """Turns XLA:CPU's YNNPACK fusions off for this process, unless XLA_FLAGS chooses."""
  os.environ['XLA_FLAGS'] = without_library_fusions(os.environ.get('XLA_FLAGS', ''))
