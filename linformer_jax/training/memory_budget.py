"""Whether a run fits in memory, checked before anything is allocated, and
XLA's out-of-memory errors as one line.

`state_bytes(abstract_state)` counts, from the shapes and shardings of the
abstract train state (`RunParts.abstract_train_state`: `jax.eval_shape`,
nothing allocated), the bytes of the parameters, the optimizer state and the
rest of the state that one device holds; the gradients are another
parameter-sized buffer. `check_state_fits` refuses a run whose state and
gradients cannot fit in what a device has (`device_memory_bytes`: an
accelerator's own limit, or the host's available memory shared by its CPU
devices), in one line naming the fields to change. The compiled step's exact
figure is checked later (`compiled_step.check_fits`).

`out_of_memory_message(error, settings)` is the one line for an out-of-memory
error that XLA (or numpy) raises on any backend: what ran out, the size it
could not allocate where the error says it, and what to change; None for any
other error. `created(tree, settings)` waits for a tree of new arrays, turning
such an error into a ConfigError. `settings` is the run's
(`run_config.RunConfig`), whose fields the advice names.
"""

import dataclasses
import math
import re
from typing import Any, Optional, Tuple

import jax
import numpy as np
import psutil

from linformer_jax.errors import ConfigError
from linformer_jax.training.run_config import RunConfig
from linformer_jax.units import GIB
from linformer_jax.units import KIB
from linformer_jax.units import MIB
from linformer_jax.units import TIB
from linformer_jax.units import size_text

# The share of a device's memory that the state and gradients may take before
# anything runs. The estimate leaves out the activations, the batch and XLA's
# temporaries of the step (the optimizer update's among them): a state and
# gradients in the last 10% leave little room for one micro-batch, and the
# line said here (a smaller model, more devices) is then the right advice,
# where the compiled step's check would only say to lower the batch. On a
# CPU, the host's available memory also counts page cache that the kernel
# gives back only under pressure. Below it, the compiled step's exact figure
# decides (`compiled_step.check_fits`).
STATE_SHARE = 0.9

# Lower-cased phrases of the allocation failures of XLA on CPU, GPU and TPU.
_OUT_OF_MEMORY_MARKERS = ('resource_exhausted', 'out of memory', 'failed to allocate')

# The size in XLA's words: 'Out of memory allocating 76800000000 bytes.' (CPU),
# 'Out of memory while trying to allocate 4770354232 bytes.' or '... 289.00GiB.'
# (GPU), 'Failed to allocate request for 2.99GiB (3206250496B) on device
# ordinal 0' (GPU), 'Used 21.95G of 15.48G hbm.' or 'HLO temporaries (29.90G)
# exceeds available HBM (15.75G).' (TPU), or numpy's 'Unable to allocate
# 71.5 GiB for an array'.
_BYTES = r'(\d+) ?B(?:ytes)?\b'
_SIZE = r'([\d.]+) ?([KMGT])(?:i?B)?\b'
_UNITS = {'K': KIB, 'M': MIB, 'G': GIB, 'T': TIB}
_REQUEST_IN_BYTES = re.compile(r'allocat\w*(?: request for [^(]*\()?\s*' + _BYTES, re.IGNORECASE)
_REQUEST = re.compile(r'allocate(?: request for)?\s+' + _SIZE, re.IGNORECASE)
_USED_OF = re.compile(r'Used ' + _SIZE + r' of ' + _SIZE + r' (\w+)')
_EXCEEDS = re.compile(r'\(' + _SIZE + r'\) exceeds available (\w+) \(' + _SIZE + r'\)')


def device_memory_bytes(device: jax.Device) -> Tuple[int, str]:
  """The memory one device may use, and where the figure comes from.

  An accelerator reports its own limit; CPU devices share the host's
  available memory (MemAvailable on Linux)."""
  stats = device.memory_stats() if device.platform != 'cpu' else None
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit']), f'{device.device_kind} memory'
  available = psutil.virtual_memory().available // max(jax.local_device_count(), 1)
  return int(available), 'host memory available per device'


def _shard_bytes(leaf: Any) -> int:
  """The bytes one device holds of an abstract (or concrete) array: its
  shard's, as the run's shardings split every dimension evenly
  (`sharding.parameter_shardings` replicates one that would not divide)."""
  sharding = getattr(leaf, 'sharding', None)
  shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else leaf.shape
  return math.prod(shape) * np.dtype(leaf.dtype).itemsize


def _tree_bytes(tree: Any) -> int:
  return sum(_shard_bytes(leaf) for leaf in jax.tree_util.tree_leaves(tree))


@dataclasses.dataclass(frozen=True)
class StateBytes:
  """The train state's bytes on one device (the largest shard of each array).

  Attributes:
    params: the parameters.
    optimizer: the optimizer state (AdamW's two moments and its counts).
    other: the step and the model's constants.
    largest: the largest parameter and its size on a device, for messages:
      'encoder/layer_0/mlp/wi/kernel float32[32, 600000000] (71.53 GiB)'.
  """

  params: int
  optimizer: int
  other: int
  largest: str = ''

  @property
  def state(self) -> int:
    """What the train state holds on the device."""
    return self.params + self.optimizer + self.other

  @property
  def with_gradients(self) -> int:
    """The state and the gradients, another parameter-sized buffer: the least
    a train step holds at once."""
    return self.state + self.params


def _largest_parameter(params: Any) -> str:
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  if not leaves:
    return ''
  path, leaf = max(leaves, key=lambda item: _shard_bytes(item[1]))
  name = '/'.join(str(getattr(key, 'key', getattr(key, 'name', key))) for key in path)
  shape = ', '.join(str(size) for size in leaf.shape)
  return f'{name} {np.dtype(leaf.dtype).name}[{shape}] ({size_text(_shard_bytes(leaf))})'


def state_bytes(abstract_state: Any) -> StateBytes:
  """The bytes one device holds of a `train_steps.TrainState` of
  `jax.ShapeDtypeStruct`s with their shardings (or of real arrays)."""
  return StateBytes(
      params=_tree_bytes(abstract_state.params),
      optimizer=_tree_bytes(abstract_state.opt_state),
      other=_tree_bytes((abstract_state.step, abstract_state.constants)),
      largest=_largest_parameter(abstract_state.params),
  )


def what_to_change(settings: RunConfig, *, step: bool, model: bool) -> str:
  """The settings of a run that lower what a device holds, for error
  messages: those of a step's activations (`step`), of the model's size
  (`model`), and the mesh."""
  loop, mesh = settings.loop, settings.mesh
  advice = []
  if step:
    advice.append(
        f'lower --config.batch_size={loop.batch_size} (or raise '
        f'--config.grad_accum_steps={loop.grad_accum_steps}) or '
        f'--config.model.max_len={settings.model.max_len}'
    )
  if model:
    fields = ', '.join(
        f'--config.model.{name}={getattr(settings.model, name)}'
        for name in ('num_layers', 'hidden_dim', 'mlp_dim')
    )
    advice.append(f'use a smaller model ({fields})')
  devices = jax.device_count()
  fsdp = '' if mesh.fsdp else ' and --config.fsdp=True'
  advice.append(
      f'split the model over more devices with --config.mesh_shape (now '
      f'{tuple(mesh.mesh_shape)} on {devices} device{"s" if devices != 1 else ""}){fsdp}'
  )
  return ', '.join(advice[:-1]) + ', or ' + advice[-1]


def check_state_fits(abstract_state: Any, settings: RunConfig) -> StateBytes:
  """Refuses a run whose train state and gradients take more than
  `STATE_SHARE` of a device's memory; returns the state's bytes otherwise.

  Args:
    abstract_state: the run's `RunParts.abstract_train_state`.
    settings: the run's settings, for the message.

  Raises:
    ConfigError: the state does not fit; the line says the estimate, the
      memory there, the largest parameter and what to change. Nothing has
      been allocated.
  """
  need = state_bytes(abstract_state)
  available, source = device_memory_bytes(jax.local_devices()[0])
  if need.with_gradients <= STATE_SHARE * available:
    return need
  raise ConfigError(
      f"The model's train state does not fit: its parameters ({size_text(need.params)}), "
      f'optimizer state ({size_text(need.optimizer)}) and gradients '
      f'({size_text(need.params)}) need {size_text(need.with_gradients)} per device, but '
      f'{size_text(available)} is there ({source}), of which at most {STATE_SHARE:.0%} can '
      f'hold them; the largest parameter is {need.largest}: '
      f'{what_to_change(settings, step=False, model=True)}.'
  )


def is_out_of_memory(error: BaseException) -> bool:
  """Whether an error of compiling or running a program says memory ran out."""
  if isinstance(error, MemoryError):
    return True
  message = str(error).lower()
  return any(marker in message for marker in _OUT_OF_MEMORY_MARKERS)


def _size(number: str, unit: str) -> int:
  return int(float(number) * _UNITS[unit.upper()])


def _what_ran_out(error: BaseException, text: str) -> str:
  """'The host', 'The GPU', or the TPU's memory space that XLA:TPU names."""
  used, exceeds = _USED_OF.search(text), _EXCEEDS.search(text)
  if used or exceeds:
    return f"The TPU's {(used.group(5) if used else exceeds.group(3)).upper()}"
  if isinstance(error, MemoryError):
    return 'The host'
  platform = jax.default_backend()
  return 'The host' if platform == 'cpu' else f'The {platform.upper()}'


def _figure(text: str) -> str:
  """' allocating 71.53 GiB', ' (it needs 21.95 GiB of 15.48 GiB)', or ''."""
  used = _USED_OF.search(text)
  if used:
    need, have = _size(*used.group(1, 2)), _size(*used.group(3, 4))
    return f' (it needs {size_text(need)} of {size_text(have)})'
  exceeds = _EXCEEDS.search(text)
  if exceeds:
    need, have = _size(*exceeds.group(1, 2)), _size(*exceeds.group(4, 5))
    return f' (its temporaries need {size_text(need)} of {size_text(have)})'
  in_bytes = _REQUEST_IN_BYTES.search(text)
  if in_bytes:
    return f' allocating {size_text(int(in_bytes.group(1)))}'
  request = _REQUEST.search(text)
  if request:
    return f' allocating {size_text(_size(*request.group(1, 2)))}'
  return ''


def out_of_memory_message(
    error: BaseException, settings: Optional[RunConfig] = None
) -> Optional[str]:
  """The one line for an out-of-memory error (`is_out_of_memory`), or None
  for any other error.

  It says what ran out (the host's memory on a CPU, the GPU's, the TPU's HBM),
  the size XLA could not allocate where its message gives one, XLA's own
  first line, and the run's settings that lower the memory (general advice
  without them)."""
  if not is_out_of_memory(error):
    return None
  text = str(error).strip()
  first_line = text.splitlines()[0][:200] if text else type(error).__name__
  if settings is not None:
    advice = what_to_change(settings, step=True, model=True)
  else:
    advice = (
        'use a smaller batch, shorter sequences or a smaller model, or spread it over more '
        'devices'
    )
  return f'{_what_ran_out(error, text)} ran out of memory{_figure(text)} ({first_line}): {advice}.'


def created(tree: Any, settings: RunConfig) -> Any:
  """`tree` (new arrays) once computed; an out-of-memory error of creating
  them as a ConfigError.

  Waiting here matters: when one output of a program cannot be allocated,
  reading another output alone (`int(state.step)`) can wait forever on XLA:CPU
  (jax 0.10), while waiting for all of them raises the error."""
  try:
    return jax.block_until_ready(tree)
  except jax.errors.JaxRuntimeError as error:
    message = out_of_memory_message(error, settings)
    if message is None:
      raise
    raise ConfigError(message) from None
