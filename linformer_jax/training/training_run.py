"""One training run as the loop (`trainer`) steps it: its parts, data, step
functions, state and checkpoints.

`TrainingRun(parts, workdir)` opens the workdir's checkpoints as their owner and
resumes from the newest intact one (the model and tokenizer checked to be the
run's own, after going back to `config.restore_step` if it is set), or starts
from the seed's draw, or from `config.init_from`; `parts` are the run's
(`run_builder.build_parts`). `TrainingRun.save` writes a
checkpoint holding every process's data-iterator position and the tokenizer's
fingerprint, and records in WORKDIR/sound_steps.json whether the step is sound
(`sound_steps`). `report` is the loop's progress line: logged, and printed on
the primary process.
"""

from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import optax

from linformer_jax import run_folder
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import evaluation
from linformer_jax.training import memory_budget
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import sound_steps
from linformer_jax.training import tasks
from linformer_jax.training import train_steps


def report(message: str) -> None:
  """Logs a message and prints it on the primary process."""
  logging.info(message)
  if jax.process_index() == 0:
    print(message, flush=True)


def _gather_bytes(data: bytes) -> List[bytes]:
  """Every process's `data`, in process order (a collective: all must call)."""
  if jax.process_count() == 1:
    return [data]
  lengths = multihost_utils.process_allgather(np.array([len(data)], np.int32))
  padded = np.zeros([int(lengths.max())], np.uint8)
  padded[: len(data)] = np.frombuffer(data, np.uint8)
  gathered = multihost_utils.process_allgather(padded)
  return [bytes(gathered[i, : int(lengths[i, 0])]) for i in range(jax.process_count())]


def _this_process_state(data_state: Dict[str, Any]) -> bytes:
  """This process's data-iterator state from a checkpoint's data state."""
  states = data_state['process_states']
  if len(states) != jax.process_count():
    raise ConfigError(
        f'The checkpoint was written by {len(states)} processes, each reading its '
        f'own shard of the data; resume it with {len(states)} processes (the mesh '
        f'may differ), not {jax.process_count()}.'
    )
  return states[jax.process_index()].encode('latin-1')


class TrainingRun:
  """One training run: its parts, data, step functions, state and checkpoints."""

  def __init__(self, parts: run_builder.RunParts, workdir: str):
    self.workdir = workdir
    self.parts = parts
    self.task = parts.task
    # The ledger first: one that cannot be read refuses the run before the
    # store (its owner) moves a damaged step aside or removes an unfinished save.
    self.ledger = sound_steps.SoundStepLedger(workdir)
    self.store = CheckpointStore(
        run_folder.RunFolder(workdir).checkpoints,
        keep=parts.settings.loop.keep_checkpoints,
        owner=True,
    )
    try:
      self._build(workdir)
    except BaseException:
      # Stops the store's background threads before the error ends the
      # program: one still running at exit prints a traceback of its own.
      self.store.close()
      raise

  def _build(self, workdir: str) -> None:
    settings = self.parts.settings
    resuming = self.store.latest_step() is not None
    if resuming:
      run_config.check_same_model(self.store.restore_config(), settings, workdir)
      divergence.go_back(self.store, settings, workdir, self.ledger)
    elif settings.loop.restore_step:
      divergence.go_back(self.store, settings, workdir, self.ledger)  # refuses it: nothing is kept
    # Checked before the data is built, so a bad init_from fails fast.
    init_from = self.task.check_init_from(settings) if settings.init_from and not resuming else None
    self.optimizer = optimization.create_optimizer(settings.optimizer)
    self.schedule = optimization.learning_rate_schedule(settings.optimizer)
    self.abstract_state = self.parts.abstract_train_state(self.optimizer)
    # Before the data is read or a checkpoint restored: a state that cannot fit stops here.
    memory_budget.check_state_fits(self.abstract_state, settings)
    self.data = self.parts.build_data(workdir)
    self.train_step = self.parts.jit_train_step(self.optimizer, self.abstract_state)
    self.eval_step = self.parts.jit_eval_step(self.abstract_state.variables())
    self.state = self._initial_state(init_from)

  def _initial_state(self, init_from: Any) -> train_steps.TrainState:
    latest = self.store.latest_step()
    if latest is not None:
      step, state, data_state, _ = self.store.restore(latest, abstract_state=self.abstract_state)
      run_builder.check_same_tokenizer(data_state, self.data, self.workdir)
      # None: an imported checkpoint (`import_checkpoint`), which no data has reached yet.
      if data_state.get('process_states') is not None:
        self.data.train_iterator.set_state(_this_process_state(data_state))
      report(f'Resumed from the checkpoint of step {step} in {self.workdir}.')
      return state
    # Created already split over the mesh: no device ever holds all of it.
    state = self.parts.initial_train_state(
        self.optimizer, self.abstract_state, self.parts.settings.loop.seed
    )
    settings = self.parts.settings
    if settings.init_from:
      state, message = self.task.initialize_from(state, self.abstract_state, settings, init_from)
      report(message)
    return state

  def device_batch(self, local_batch: Dict[str, np.ndarray]) -> Dict[str, jax.Array]:
    """This process's rows of a batch as global arrays split over the mesh."""
    return self.parts.device_batch(local_batch)

  def save(
      self,
      force: bool = False,
      data_position: Optional[bytes] = None,
      guard: Optional[divergence.DivergenceGuard] = None,
  ) -> None:
    """Saves the state; `data_position` is the iterator's state after the
    batches the saved steps consumed (default: its state now; a loop that
    read ahead passes the one it kept). Records in the workdir's ledger
    whether the step is sound (`sound_steps`), with `guard`'s losses and
    suspicion (none without a guard)."""
    # Every process reads its own shard, so the checkpoint keeps every
    # process's iterator position (orbax writes JSON from process 0 only), and
    # the tokenizer's fingerprint, so that no other tokenizer resumes it.
    position = data_position if data_position is not None else self.data.train_iterator.get_state()
    states = _gather_bytes(position)
    data_state = {
        'process_states': [state.decode('latin-1') for state in states],
        'tokenizer_sha256': self.data.tokenizer_sha256,
    }
    step = int(self.state.step)
    kept_before = self.store.all_steps()  # read before the save: never a folder being written
    saved = self.store.save(
        step,
        state=self.state,
        data_state=data_state,
        config=self.parts.settings.to_dict(),
        force=force,
    )
    if not saved:
      return
    finite, norm = jax.device_get(_health(self.state))
    self.ledger.record(
        step,
        finite=bool(finite),
        param_norm=float(norm),
        recent_losses=guard.recent_losses() if guard else (),
        suspect=guard.suspicion(step) if guard else '',
    )
    self.ledger.keep_only(kept_before + [step])  # a step the save removed goes at the next one
    self.ledger.write()

  def evaluate(self) -> Dict[str, float]:
    """The task's metrics on the evaluation batches; a perplexity too large
    to mean anything as inf (`evaluation.bounded`)."""
    return evaluation.bounded(
        tasks.evaluate_batches(
            self.task,
            self.eval_step,
            self.state.variables(),
            self.data.eval_batches,
            self.device_batch,
        )
    )


@jax.jit
def _health(state: train_steps.TrainState) -> Tuple[jax.Array, jax.Array]:
  """Whether the parameters and optimizer state are all finite, and the
  parameters' global L2 norm."""
  finite = train_steps.all_finite((state.params, state.opt_state))
  return finite, optax.tree.norm(state.params)
