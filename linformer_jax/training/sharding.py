"""The device mesh, parameter shardings and globally sharded batches.

A run's devices form a mesh with axes ('data', 'model') of shape
`config.mesh_shape`. Parameters carry logical axis names
(`linformer_jax.model.logical_axes`); `config.axis_rules` maps them to mesh axes, so
how a model is split is a config value. Batches are split over 'data'. With `config.fsdp`
parameters and optimizer state are split over 'data' too (ZeRO-3, maxtext's
'fsdp' axis): each device keeps 1/data of them and XLA gathers a layer's
weights when it needs them. All of
it goes through `jax.jit` with explicit shardings; XLA inserts the collectives.

Everything the user can get wrong (a mesh that does not match the devices, a
'model' axis that does not divide the heads or the MLP width, a batch that
does not divide over 'data') is a `ConfigError` raised before anything is
compiled.
"""

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from linformer_jax.errors import ConfigError
from linformer_jax.model.attention import MeshPartition
from linformer_jax.model.model_config import ModelConfig

MESH_AXES = ('data', 'model')
DATA_AXIS, MODEL_AXIS = MESH_AXES

# Batch over 'data'; heads, MLP units and vocabulary over 'model'; everything
# else (the embedding width, sequence positions, the projections E/F)
# replicated.
DEFAULT_AXIS_RULES = (
    ('batch', DATA_AXIS),
    ('heads', MODEL_AXIS),
    ('mlp', MODEL_AXIS),
    ('vocab', MODEL_AXIS),
)


def resolve_mesh_shape(mesh_shape: Sequence[int], device_count: int) -> Tuple[int, int]:
  """The (data, model) sizes, with a -1 entry taking the remaining devices."""
  shape = tuple(mesh_shape)
  if len(shape) != len(MESH_AXES) or any(
      isinstance(s, bool) or not isinstance(s, int) or (s < 1 and s != -1) for s in shape
  ):
    raise ConfigError(
        f'config.mesh_shape={shape!r} is not allowed: give two positive ints for '
        f'the axes {MESH_AXES}, one of them may be -1 (all remaining devices).'
    )
  if shape.count(-1) > 1:
    raise ConfigError(
        f'config.mesh_shape={shape!r} has more than one -1; fix all but one axis size.'
    )
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if device_count % known:
      raise ConfigError(
          f'config.mesh_shape={shape!r}: {device_count} devices do not divide '
          f'into axes of {known}; use sizes whose product divides {device_count}.'
      )
    shape = tuple(device_count // known if s == -1 else s for s in shape)
  if math.prod(shape) != device_count:
    raise ConfigError(
        f'config.mesh_shape={shape!r} needs {math.prod(shape)} devices but there '
        f'are {device_count}; use sizes whose product is {device_count} '
        '(e.g. (-1, 1)).'
    )
  return shape


def create_mesh(mesh_shape: Sequence[int], devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A ('data', 'model') mesh over all devices (or the given ones).

  On several TPU slices (devices of more than one `slice_index`, joined by the
  data-centre network) 'data' spans the slices and 'model' stays inside one:
  only the gradients' all-reduce crosses between slices.
  """
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  # Auto axes: XLA propagates the parameter and batch shardings through the
  # model (GSPMD), so the model code needs no sharding annotations.
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  slices = len({getattr(device, 'slice_index', 0) for device in devices})
  if slices == 1:
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)
  data, model = shape
  if data % slices:
    raise ConfigError(
        f'config.mesh_shape={tuple(mesh_shape)!r} on {slices} TPU slices: the data axis '
        f'({data}) spans the slices, so it must be a multiple of {slices}; use e.g. '
        f'({slices}, {len(devices) // slices}).'
    )
  grid = mesh_utils.create_hybrid_device_mesh((data // slices, model), (slices, 1), devices)
  return Mesh(grid, MESH_AXES, axis_types=auto)


def axis_rules(config) -> Tuple[Tuple[str, Any], ...]:
  """`config.axis_rules` as a tuple of (logical name, mesh axis or None)."""
  rules = tuple(
      (str(name), None if axis in (None, '', 'none') else axis) for name, axis in config.axis_rules
  )
  for name, axis in rules:
    if axis is not None and axis not in MESH_AXES:
      raise ConfigError(
          f'config.axis_rules maps {name!r} to {axis!r}, which is not a mesh axis; '
          f'use one of {MESH_AXES} or None (replicated).'
      )
  return rules


def _mesh_axis_of(logical_name: str, rules) -> Optional[str]:
  for name, axis in rules:
    if name == logical_name:
      return axis
  return None


def check_divisibility(
    model_config: ModelConfig, mesh: Mesh, rules, *, batch_size: int, eval_batch_size: int
) -> None:
  """Raises ConfigError when the mesh cannot split the model or the batches."""
  for logical_name, size, field in (
      ('heads', model_config.num_heads, 'num_heads'),
      ('mlp', model_config.mlp_dim, 'mlp_dim'),
  ):
    axis = _mesh_axis_of(logical_name, rules)
    if axis is not None and size % mesh.shape[axis]:
      raise ConfigError(
          f'config.model.{field}={size} is not divisible by the {mesh.shape[axis]} '
          f"devices of mesh axis '{axis}' (config.mesh_shape={tuple(mesh.shape.values())}); "
          f'change one of them so that {field} divides evenly.'
      )
  axis = _mesh_axis_of('batch', rules)
  if axis is not None:
    for field, size in (('batch_size', batch_size), ('eval_batch_size', eval_batch_size)):
      if size % mesh.shape[axis]:
        raise ConfigError(
            f'config.{field}={size} is not divisible by the {mesh.shape[axis]} '
            f"devices of mesh axis '{axis}'; use a multiple of {mesh.shape[axis]}."
        )


def _fits(spec: PartitionSpec, shape: Tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """The spec, with axes that do not divide their dimension replicated.

  The vocabulary (e.g. 260 byte ids) need not divide the 'model' axis; such a
  dimension is replicated rather than refused. Heads and MLP units are checked
  by `check_divisibility` instead, because splitting them is the point.
  """
  entries = []
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axis,) if isinstance(axis, str) else tuple(axis or ())
    ways = math.prod(mesh.shape[n] for n in names)
    entries.append(axis if ways and dim % ways == 0 else None)
  return PartitionSpec(*entries)


def _over_data(spec: PartitionSpec, shape: Tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """The spec with its largest dimension not yet split also split over 'data'.

  A parameter none of whose free dimensions divides the 'data' axis (a bias of
  MLP units split over 'model', a scalar) stays replicated over 'data', as
  `_fits` replicates a vocabulary that does not divide: it costs little memory,
  and a run should not be refused for it.
  """
  data = mesh.shape[DATA_AXIS]
  entries = list(spec) + [None] * (len(shape) - len(spec))
  used = {n for axis in entries for n in ((axis,) if isinstance(axis, str) else axis or ())}
  free = [i for i, axis in enumerate(entries) if axis is None and shape[i] % data == 0]
  if data == 1 or DATA_AXIS in used or not free:
    return PartitionSpec(*entries)
  entries[max(free, key=lambda i: shape[i])] = DATA_AXIS
  return PartitionSpec(*entries)


def parameter_shardings(boxed_variables: Any, mesh: Mesh, rules, fsdp: bool = False) -> Any:
  """NamedShardings of a (boxed, abstract) variable tree from its logical axes,
  each also split over 'data' where `fsdp` (see `_over_data`)."""
  is_spec = lambda x: isinstance(x, PartitionSpec)
  logical_specs = nn.get_partition_spec(boxed_variables)
  unboxed = nn.meta.unbox(boxed_variables)

  def sharding(spec: PartitionSpec, leaf: Any) -> NamedSharding:
    spec = _fits(nn.logical_to_mesh_axes(spec, rules), leaf.shape, mesh)
    return NamedSharding(mesh, _over_data(spec, leaf.shape, mesh) if fsdp else spec)

  return jax.tree_util.tree_map(sharding, logical_specs, unboxed, is_leaf=is_spec)


def kernel_partition(mesh: Mesh, rules) -> MeshPartition:
  """How a fused attention kernel splits over the mesh: the batch over the
  mesh axis of 'batch', the heads over that of 'heads' (as the dense layers'
  head axis is split)."""
  batch, heads = _mesh_axis_of('batch', rules), _mesh_axis_of('heads', rules)
  return MeshPartition(mesh, (batch,) if batch else (), (heads,) if heads else ())


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Splits the leading (batch) dimension over the mesh axis of 'batch'."""
  return NamedSharding(mesh, PartitionSpec(_mesh_axis_of('batch', rules)))


def global_batch(
    local_batch: Mapping[str, np.ndarray], sharding: NamedSharding
) -> Dict[str, jax.Array]:
  """Assembles the processes' local batches into global arrays split over 'data'."""
  return {
      name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
      for name, value in local_batch.items()
  }
