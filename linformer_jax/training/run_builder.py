"""Builds a run's parts in one place, for training, evaluation, spectrum and
mesh memory.

`build_parts(config)` checks the config and returns `RunParts`: the typed
settings, the task, the model, the device mesh and its axis rules
(`parts_of(settings)` builds them from settings already typed). From them
come the abstract train state (shapes and shardings, nothing computed), the
jitted step functions and this process's data; `run_loading` restores a
run's checkpoint onto them for evaluation or inference.
`check_same_tokenizer` refuses a checkpoint trained with another tokenizer.
`save_config(settings, workdir)` writes a run's config and a copy of each
extension file into its folder; `saved_config(workdir)` is the config a run
saved, ready to build with its own extensions.
"""

import dataclasses
import json
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from linformer_jax import extensions
from linformer_jax import registry
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import memory_budget
from linformer_jax.training import run_config
from linformer_jax.training import sharding as sharding_lib
from linformer_jax.training import tasks
from linformer_jax.training import train_steps


def _with_shardings(shapes: Any, shardings: Any) -> Any:
  return jax.tree_util.tree_map(
      lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      shapes,
      shardings,
  )


def shardings_of(abstract_tree: Any) -> Any:
  """The tree of shardings of a tree of `jax.ShapeDtypeStruct`s."""
  return jax.tree_util.tree_map(lambda x: x.sharding, abstract_tree)


@dataclasses.dataclass(frozen=True)
class RunParts:
  """What every use of a run's config shares: task, model and mesh.

  Attributes:
    settings: the run's checked settings (`run_config.RunConfig`), the
      model's attention kernel resolved for the mesh (`to_dict` gives the
      config's own value back).
    task: the task object of config.task.
    model: the task's Flax model.
    mesh: the ('data', 'model') device mesh of config.mesh_shape.
    rules: logical axis name -> mesh axis (config.axis_rules).
    batch_sharding: batches split over the 'data' axis.
    fsdp: parameters and optimizer state also split over 'data' (config.fsdp).
    kernel_reason: why the model attends with `model_config.attention_kernel`
      ('auto: cuDNN fused attention on gpu', 'as configured').
  """

  settings: run_config.RunConfig
  task: tasks.Task
  model: nn.Module
  mesh: jax.sharding.Mesh
  rules: Tuple[Tuple[str, Any], ...]
  batch_sharding: jax.sharding.NamedSharding
  fsdp: bool = False
  kernel_reason: str = 'as configured'

  @property
  def model_config(self) -> ModelConfig:
    """The checked model fields."""
    return self.settings.model

  def _boxed_variables(self) -> Dict[str, Any]:
    """The model's variables as abstract arrays inside their logical-axis boxes."""
    tokens = jnp.ones((1, self.model_config.max_len), jnp.int32)
    return jax.eval_shape(self.model.init, jax.random.PRNGKey(0), tokens)

  def abstract_variables(self) -> Dict[str, Any]:
    """{'params': ..., other collections...} as `jax.ShapeDtypeStruct`s carrying
    their shardings: what `TrainState.variables()` returns, uncomputed."""
    boxed = self._boxed_variables()
    return _with_shardings(
        nn.meta.unbox(boxed),
        sharding_lib.parameter_shardings(boxed, self.mesh, self.rules, self.fsdp),
    )

  def initial_variables(self, seed: int) -> Dict[str, Any]:
    """The variables a fresh run seeded by `seed` starts from ({'params': ...,
    other collections}): the trainer's draw, created split over the mesh.

    Raises:
      ConfigError: XLA ran out of memory creating them, in one line.
    """
    tokens = jnp.ones((1, self.model_config.max_len), jnp.int32)
    init = jax.jit(
        lambda rng: nn.meta.unbox(self.model.init(rng, tokens)),
        out_shardings=shardings_of(self.abstract_variables()),
    )
    return memory_budget.created(init(jax.random.PRNGKey(seed)), self.settings)

  def initial_train_state(
      self,
      optimizer: optax.GradientTransformation,
      abstract_state: train_steps.TrainState,
      seed: int,
  ) -> train_steps.TrainState:
    """The train state a fresh run seeded by `seed` starts from, created split
    over the mesh as `abstract_state` (`abstract_train_state`) lays it out.

    Raises:
      ConfigError: the state and its gradients cannot fit in a device's memory
        (`memory_budget.check_state_fits`), said before anything is allocated;
        or XLA ran out of memory creating the state anyway.
    """
    memory_budget.check_state_fits(abstract_state, self.settings)
    init = jax.jit(
        lambda rng: train_steps.init_train_state(
            rng, model=self.model, optimizer=optimizer, seq_len=self.model_config.max_len
        ),
        out_shardings=shardings_of(abstract_state),
    )
    return memory_budget.created(init(jax.random.PRNGKey(seed)), self.settings)

  def abstract_train_state(self, optimizer: optax.GradientTransformation) -> train_steps.TrainState:
    """The train state as `jax.ShapeDtypeStruct`s carrying their shardings.

    Parameters and constants follow their logical axis names through the
    rules. The optimizer is initialised (abstractly) on the boxed parameters,
    so each moment inherits its parameter's logical axes exactly; the step and
    other scalars are replicated.
    """
    boxed = self._boxed_variables()
    boxed_opt_state = jax.eval_shape(optimizer.init, boxed['params'])
    variables = _with_shardings(
        nn.meta.unbox(boxed),
        sharding_lib.parameter_shardings(boxed, self.mesh, self.rules, self.fsdp),
    )
    opt_state = _with_shardings(
        nn.meta.unbox(boxed_opt_state),
        sharding_lib.parameter_shardings(boxed_opt_state, self.mesh, self.rules, self.fsdp),
    )
    params = variables.pop('params')
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding_lib.replicated(self.mesh))
    return train_steps.TrainState(
        step=step, params=params, opt_state=opt_state, constants=variables
    )

  def jit_train_step(
      self, optimizer: optax.GradientTransformation, abstract_state: train_steps.TrainState
  ):
    """The jitted train step on the mesh, state donated."""
    return train_steps.jit_train_step(
        self.task.loss_sums(self.model, self.settings),
        optimizer,
        self.settings.loop.grad_accum_steps,
        state_shardings=shardings_of(abstract_state),
        batch_sharding=self.batch_sharding,
        compute_shardings=self._gathered_parameter_shardings(),
    )

  def _gathered_parameter_shardings(self) -> Any:
    """With FSDP, the parameters' shardings without the 'data' split: the
    train and eval steps gather them so that the activations stay split by batch."""
    if not self.fsdp:
      return None
    boxed = self._boxed_variables()['params']
    return sharding_lib.parameter_shardings(boxed, self.mesh, self.rules)

  def jit_eval_step(self, abstract_variables: Mapping[str, Any]):
    """The jitted eval step on the mesh: (variables, batch) -> loss sums."""
    return train_steps.jit_eval_step(
        self.task.loss_sums(self.model, self.settings),
        variable_shardings=shardings_of(abstract_variables),
        batch_sharding=self.batch_sharding,
        compute_shardings=self._gathered_parameter_shardings(),
    )

  def abstract_batch(self) -> Dict[str, jax.ShapeDtypeStruct]:
    """A global training batch as `jax.ShapeDtypeStruct`s (for compiling only)."""
    return {
        name: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
        for name, (shape, dtype) in self.task.batch_shapes(self.settings).items()
    }

  def device_batch(self, local_batch: Mapping[str, np.ndarray]) -> Dict[str, jax.Array]:
    """This process's rows of a batch as global arrays split over the mesh."""
    return sharding_lib.global_batch(local_batch, self.batch_sharding)

  def build_data(self, workdir: str, *, train: bool = True) -> Any:
    """This process's data; process 0 goes first and trains the tokenizer.

    The other processes wait for it, then load the tokenizer it saved in the
    workdir, so that all of them use the same token ids. Without `train`, the
    data has no training iterator (evaluation only).
    """
    build = lambda: self.task.build_data(
        self.settings,
        workdir,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        train=train,
    )
    if jax.process_count() == 1:
      return build()
    data = build() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices('linformer_jax: tokenizer and data cache ready')
    return data if data is not None else build()


def check_same_tokenizer(data_state: Mapping[str, Any], data: Any, workdir: str) -> None:
  """Refuses to resume a checkpoint onto another tokenizer than its own.

  Args:
    data_state: a checkpoint's data state; its 'tokenizer_sha256' (absent in
      older checkpoints, which pass) is the sha256 of the tokenizer file
      (tokenizer.model or tokenizer.json) it was trained with, None for one
      without (bytes, ListOps).
    data: the run's data, whose `tokenizer_sha256` is the current one's.
    workdir: the run's directory, for the message.

  Raises:
    ConfigError: the fingerprints differ.
  """
  if 'tokenizer_sha256' not in data_state:
    return
  saved, current = data_state['tokenizer_sha256'], data.tokenizer_sha256
  if saved == current:
    return
  tokenizer = getattr(data, 'tokenizer', None)
  path = getattr(tokenizer, 'model_path', None) or run_folder.RunFolder(workdir).tokenizer()
  if saved is None or current is None:
    used, uses = ('without', 'with') if saved is None else ('with', 'without')
    raise ConfigError(
        f'The checkpoint in {workdir} was trained {used} {path}, this run is {uses} it; set '
        'config.data.tokenizer as the checkpoint was trained, or use another --workdir.'
    )
  if getattr(tokenizer, 'made_now', False):
    # The run's own file was gone, and the one made in its place differs.
    raise ConfigError(
        f'{path} was missing, and the one made again now is not the tokenizer the checkpoint '
        f'in {workdir} was trained with (its sha256 starts {current[:16]}, not {saved[:16]}); '
        'put the original file back, give the data the run was trained on (its config.json '
        'names it), or use another --workdir to start a new run.'
    )
  raise ConfigError(
      f'{path} is not the tokenizer the checkpoint in {workdir} was trained with (its sha256 '
      f'starts {current[:16]}, not {saved[:16]}); put the original file back, or use another '
      '--workdir to start a new run.'
  )


def train_step_kernel_note(model_config: ModelConfig, loop: run_config.LoopSettings) -> str:
  """'; the train step attends by einsum, since ...' where the fused kernel's
  mesh cannot split the train step's micro-batches (`attention.attend_with`
  then attends by the einsums), else ''."""
  partition = model_config.kernel_partition
  if partition is None:
    return ''
  micro_batch = loop.batch_size // loop.grad_accum_steps
  refusal = partition.refusal(micro_batch, model_config.num_heads)
  return f'; the train step attends by einsum, since {refusal}' if refusal else ''


def build_parts(
    config: ml_collections.ConfigDict, devices: Optional[Sequence[jax.Device]] = None
) -> RunParts:
  """Checks the config and builds the task, model and mesh of a run.

  The config is typed and checked here, once (`run_config.RunConfig`); what
  is built below reads the typed tree (`parts_of`). The mesh spans `devices`
  (by default all of JAX's devices): compile-only analyses pass the devices
  of an accelerator this host does not have.

  Raises:
    ConfigError: a bad config field, or a mesh that cannot split the model or
      the batches; nothing is compiled or written.
  """
  return parts_of(run_config.RunConfig.from_config(config), devices)


def parts_of(
    settings: run_config.RunConfig, devices: Optional[Sequence[jax.Device]] = None
) -> RunParts:
  """The task, model and mesh of a run of `settings` (`build_parts`), e.g. of
  a run's settings changed to analyse a variant of its step.

  Raises:
    ConfigError: a mesh that cannot split the model or the batches, or an
      attention kernel that cannot run on the devices.
  """
  mesh = sharding_lib.create_mesh(settings.mesh.mesh_shape, devices)
  rules = sharding_lib.axis_rules(settings.mesh)
  # 'auto' takes its kernel from the devices the step is compiled for, not the host;
  # a fused kernel runs per device, inside a shard_map over the mesh.
  model_config, kernel_reason = settings.model.with_kernel_for(
      mesh.devices.flat[0].platform, sharding_lib.kernel_partition(mesh, rules)
  )
  kernel_reason += train_step_kernel_note(model_config, settings.loop)
  settings = settings.with_model(model_config)
  task = tasks.task_of(settings)
  sharding_lib.check_divisibility(
      model_config,
      mesh,
      rules,
      batch_size=settings.loop.batch_size,
      eval_batch_size=settings.loop.eval_batch_size,
  )
  # The data builders check model.vocab_size against the tokenizer.
  return RunParts(
      settings=settings,
      task=task,
      model=task.create_model(settings),
      mesh=mesh,
      rules=rules,
      batch_sharding=sharding_lib.batch_sharding(mesh, rules),
      fsdp=settings.mesh.fsdp,
      kernel_reason=kernel_reason,
  )


def _tuples(value: Any) -> Any:
  """JSON's lists back to the tuples the configs hold."""
  if isinstance(value, dict):
    return {key: _tuples(item) for key, item in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(item) for item in value)
  return value


def save_config(settings: run_config.RunConfig, workdir: str) -> None:
  """Writes WORKDIR/config.json (on process 0), whole or not at all: the run's
  config (`settings.to_dict()`), naming each extension file by its absolute
  path; and keeps a copy of each file in WORKDIR/extensions/: the run then
  loads from any directory, and after its files move or change (`saved_config`).

  Training calls it once every check that can refuse the run has passed: the
  run keeps from then on what it made before (its folder, its tokenizer;
  `storage.keep_created`), whatever stops it later.
  """
  storage.keep_created()
  if jax.process_index() != 0:
    return
  saved = settings.to_dict()
  saved['extensions'] = extensions.saved_entries(settings.extensions)
  extensions.keep_copies(settings.extensions, workdir)
  storage.write_text(
      run_folder.RunFolder(workdir).config, json.dumps(saved, indent=2, sort_keys=True)
  )


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run saved in WORKDIR/config.json, ready to build
  (`config_from_saved`), its extension files imported from their originals or
  from the run's copies (`extensions.import_run_extensions`, which prints which).

  Raises:
    ConfigError: no config.json in workdir, one that is not a run's config
      (e.g. a Hugging Face folder's), or an extension that fails to import.
  """
  path = run_folder.RunFolder(workdir).config
  if not storage.isfile(path):
    raise ConfigError(f'{path} does not exist; point at a run folder, one that training wrote.')
  try:
    saved = json.loads(storage.read_text(path))
  except ValueError as error:
    raise ConfigError(f'{path} is not a JSON config ({error}); point at a run folder.') from None
  return config_from_saved(saved, path, workdir=workdir)


def config_from_saved(
    saved: Any, origin: str, *, workdir: Optional[str] = None
) -> ml_collections.ConfigDict:
  """A run's config as JSON read it (a run's config.json, or the copy an
  exported Hugging Face folder carries), ready to build: JSON's lists back to
  tuples (as configs/from_workdir.py reads it), the run's `extensions`
  imported and the settings their kinds declare added.

  With the run's `workdir`, a file the run keeps a copy of is imported from
  that copy where the original moved or changed; `extensions` then names the
  files imported, and one printed line says which were used.

  Raises:
    ConfigError: `saved` is not a run's config (`origin` names where it was
      read), or an extension fails to import.
  """
  if not (
      isinstance(saved, dict)
      and isinstance(saved.get('model'), dict)
      and isinstance(saved.get('data'), dict)
  ):
    raise ConfigError(
        f"{origin} is not a run's config (it has no model and data sections); point at a run "
        'folder, one that training wrote (a Hugging Face folder is read with import_checkpoint).'
    )
  config = ml_collections.ConfigDict(_tuples(saved))
  run_config.complete(config)
  if workdir is None:
    extensions.import_extensions(config.extensions)
  else:
    config.extensions, line = extensions.import_run_extensions(config.extensions, workdir)
    if line:
      print(line, flush=True)
  registry.add_declared_settings(config)
  return config
