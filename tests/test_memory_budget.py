"""Whether a run fits in memory (issue 58, item 4): the state's bytes counted
exactly before anything is allocated, a model too large refused in one line
before it is created or compiled, and XLA's out-of-memory errors as one line."""

import os
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from run_helpers import one_error_line
from run_helpers import tiny_config
from run_helpers import tiny_flags
from run_helpers import typed

from linformer_jax import cli
from linformer_jax.errors import ConfigError
from linformer_jax.training import compiled_step
from linformer_jax.training import memory_budget
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.units import GIB
from linformer_jax.units import MIB

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parts_and_state(config):
  parts = run_builder.build_parts(config)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  return parts, optimizer, parts.abstract_train_state(optimizer)


def _nbytes(tree):
  return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree))


def _device_memory(monkeypatch, module, available):
  """Makes `module` see `available` bytes on every device."""
  monkeypatch.setattr(module, 'device_memory_bytes', lambda device: (available, 'a test'))


def test_the_estimate_is_the_initialised_states_bytes():
  parts, optimizer, abstract = _parts_and_state(tiny_config())
  estimate = memory_budget.state_bytes(abstract)
  state = parts.initial_train_state(optimizer, abstract, seed=0)
  assert estimate.params == _nbytes(state.params) == 4 * 28_132
  assert estimate.optimizer == _nbytes(state.opt_state)
  assert estimate.other == _nbytes((state.step, state.constants))
  assert estimate.state == _nbytes(state)
  assert estimate.with_gradients == _nbytes(state) + _nbytes(state.params)
  assert estimate.largest == 'encoder/token_embedding/embedding float32[260, 32] (0.0 MiB)'


# Run on 4 CPU devices (set before JAX starts): the largest per-device total of
# the real state's shards, and the estimate.
_SHARDED_STATE = textwrap.dedent("""
    import os
    os.environ['JAX_NUM_CPU_DEVICES'] = '4'
    import jax
    from configs import tiny
    from linformer_jax.training import memory_budget, optimization, run_builder
    config = tiny.get_config()
    config.mesh_shape, config.fsdp = (2, 2), True
    parts = run_builder.build_parts(config)
    optimizer = optimization.create_optimizer(parts.settings.optimizer)
    abstract = parts.abstract_train_state(optimizer)
    state = parts.initial_train_state(optimizer, abstract, 0)
    held = {}
    for leaf in jax.tree_util.tree_leaves(state):
      for shard in leaf.addressable_shards:
        held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    print(len(held), max(held.values()), memory_budget.state_bytes(abstract).state)
    """)


def test_the_estimate_is_each_devices_share_of_a_sharded_state():
  result = subprocess.run(
      [sys.executable, '-c', _SHARDED_STATE],
      cwd=REPO_ROOT,
      env={**os.environ, 'PYTHONPATH': REPO_ROOT, 'JAX_PLATFORMS': 'cpu'},
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
  )
  devices, held, estimate = map(int, result.stdout.split())
  assert devices == 4
  assert held == estimate
  # Split two ways by 'model' or 'data' (FSDP), most leaves four ways: well
  # under the replicated state.
  _, _, replicated = _parts_and_state(tiny_config())
  assert estimate < memory_budget.state_bytes(replicated).state / 2


def test_a_state_that_cannot_fit_is_refused_before_anything_is_created(monkeypatch):
  parts, optimizer, abstract = _parts_and_state(tiny_config())
  need = memory_budget.state_bytes(abstract).with_gradients
  _device_memory(monkeypatch, memory_budget, need)

  def no_program(*args, **kwargs):
    raise AssertionError('a program was made for a state that cannot fit')

  monkeypatch.setattr(jax, 'jit', no_program)
  with pytest.raises(ConfigError) as error:
    parts.initial_train_state(optimizer, abstract, seed=0)
  message = str(error.value)
  assert '\n' not in message
  assert message.startswith("The model's train state does not fit: its parameters (0.1 MiB)")
  assert f'need 0.4 MiB per device, but {need / MIB:.1f} MiB is there (a test)' in message
  assert 'at most 90% can hold them' in message
  assert 'the largest parameter is encoder/token_embedding/embedding float32[260, 32]' in message
  for flag in ('--config.model.num_layers=2', '--config.model.mlp_dim=64', '--config.fsdp=True'):
    assert flag in message


def test_a_state_within_its_share_of_the_memory_passes(monkeypatch):
  parts, _, abstract = _parts_and_state(tiny_config())
  need = memory_budget.state_bytes(abstract).with_gradients
  _device_memory(monkeypatch, memory_budget, int(need / memory_budget.STATE_SHARE) + 1)
  assert memory_budget.check_state_fits(abstract, parts.settings).with_gradients == need


def test_the_command_refuses_a_model_too_large_in_one_line_before_compiling(tmp_path, run_command):
  # 600 M MLP units: 286 GiB of MLP kernels; refused from the shapes alone,
  # with nothing allocated, compiled or written. The data (read before the
  # model is created) is a small file, quick to prepare.
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'words.txt').write_text('\n\n'.join(['word ' * 50] * 20))
  workdir = tmp_path / 'run'
  result = run_command(
      'train',
      *tiny_flags(workdir),
      '--config.model.mlp_dim=600000000',
      '--config.data.source=text_files',
      f'--config.data.path={corpus}',
      '--config.data.eval_split=train',
      '--config.data.prepare_workers=1',
  )
  line = one_error_line(
      result,
      "The model's train state does not fit",
      'need 1162.29 GiB per device',
      'host memory available per device',
      'encoder/layers_0/mlp/wi/kernel float32[32, 600000000] (71.53 GiB)',
      '--config.model.mlp_dim=600000000',
  )
  assert line.startswith("error: The model's train state does not fit: its parameters (290.57 GiB)")
  assert 'compiled' not in result.stdout
  assert not workdir.exists()


def test_a_real_out_of_memory_error_of_creating_arrays_is_one_line():
  # 2**50 bytes: more than a process can map, so XLA:CPU's allocation fails at
  # once, whatever the host. Reading the small output alone would wait forever.
  make = jax.jit(lambda key: (jnp.zeros((), jnp.int32), jax.random.normal(key, (2**18, 2**30))))
  with pytest.raises(ConfigError) as error:
    memory_budget.created(make(jax.random.PRNGKey(0)), typed(tiny_config()))
  assert str(error.value) == (
      'The host ran out of memory allocating 1048576.00 GiB (RESOURCE_EXHAUSTED: Out of '
      'memory allocating 1125899906842624 bytes.): lower --config.batch_size=4 (or raise '
      '--config.grad_accum_steps=1) or --config.model.max_len=32, use a smaller model '
      '(--config.model.num_layers=2, --config.model.hidden_dim=32, --config.model.mlp_dim=64), '
      'or split the model over more devices with --config.mesh_shape (now (-1, 1) on 1 '
      'device) and --config.fsdp=True.'
  )


# XLA's words on each backend (GPU and TPU as reported in jax-ml/jax#13428,
# google-deepmind/jax_privacy#10, LargeWorldModel/LWM#60), numpy's MemoryError.
_GPU_BUFFERS = (
    'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.\n'
    'BufferAssignment OOM Debugging.\nBufferAssignment stats:\n'
    '             parameter allocation:  372.76MiB\n'
)
_GPU_REQUEST = (
    'RESOURCE_EXHAUSTED: Failed to allocate request for 176.00MiB (184549376B) on device ordinal 0'
)
_TPU_COMPILE = (
    'RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space '
    'hbm. Used 21.95G of 15.48G hbm.\n Exceeded hbm capacity by 6.47G.\n\n'
    'Total hbm usage >= 22.47G:\n    reserved        530.00M\n    program          21.95G\n'
)
_TPU_TEMPORARIES = (
    'RESOURCE_EXHAUSTED: Error loading program: Attempting to allocate 29.90G. That was not '
    'possible. HLO temporaries (29.90G) exceeds available HBM (15.75G).'
)


@pytest.mark.parametrize(
    'backend, error, start',
    [
        (
            'gpu',
            jax.errors.JaxRuntimeError(_GPU_BUFFERS),
            'The GPU ran out of memory allocating 4.44 GiB',
        ),
        (
            'gpu',
            jax.errors.JaxRuntimeError(_GPU_REQUEST),
            'The GPU ran out of memory allocating 176.0 MiB',
        ),
        (
            'gpu',
            jax.errors.JaxRuntimeError(
                'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 289.00GiB.'
            ),
            'The GPU ran out of memory allocating 289.00 GiB',
        ),
        (
            'tpu',
            jax.errors.JaxRuntimeError(_TPU_COMPILE),
            "The TPU's HBM ran out of memory (it needs 21.95 GiB of 15.48 GiB)",
        ),
        (
            'tpu',
            jax.errors.JaxRuntimeError(_TPU_TEMPORARIES),
            "The TPU's HBM ran out of memory (its temporaries need 29.90 GiB of 15.75 GiB)",
        ),
        (
            'cpu',
            MemoryError('Unable to allocate 71.5 GiB for an array with shape (32, 600000000)'),
            'The host ran out of memory allocating 71.50 GiB',
        ),
    ],
)
def test_out_of_memory_on_each_backend_is_one_line(backend, error, start, monkeypatch):
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  message = memory_budget.out_of_memory_message(error, typed(tiny_config()))
  assert '\n' not in message
  assert message.startswith(start + ' (' + str(error).splitlines()[0][:200] + '): lower ')
  assert '--config.batch_size=4' in message and '--config.model.mlp_dim=64' in message
  general = memory_budget.out_of_memory_message(error)
  # A command whose --config is no run's gives the general advice.
  not_a_run = cli.run_settings(ml_collections.ConfigDict({'n': 1}))
  assert memory_budget.out_of_memory_message(error, not_a_run) == general
  assert general.endswith(
      ': use a smaller batch, shorter sequences or a smaller model, or spread it over more devices.'
  )


def test_other_errors_are_not_out_of_memory():
  assert memory_budget.out_of_memory_message(jax.errors.JaxRuntimeError('INTERNAL: other')) is None
  assert memory_budget.out_of_memory_message(ValueError('a bad value')) is None


# On CPU devices the host's available memory (1 GiB here) is read with the
# state already in it: the step's arguments that the state holds are there,
# not needed again.
def test_the_step_check_counts_the_state_the_host_already_holds(monkeypatch):
  _device_memory(monkeypatch, compiled_step, GIB)
  held = compiled_step.StepCost(2 * GIB, GIB // 2, 0.0, held_bytes=2 * GIB)
  compiled_step.check_fits(held, typed(tiny_config()))


@pytest.mark.parametrize(
    'cost, refusal',
    [
        (
            compiled_step.StepCost(2 * GIB, GIB // 2, 0.0),
            'needs 2.50 GiB per device (arguments 2.00, temporaries 0.50) but 1.00 GiB is there '
            '(a test): lower --config.batch_size=4',
        ),
        (
            compiled_step.StepCost(4 * GIB, GIB, 0.0, held_bytes=3 * GIB),
            "but 4.00 GiB is there (a test), the run's state (3.00 GiB) included:",
        ),
    ],
    ids=['nothing held', 'more than the state held'],
)
def test_a_step_that_does_not_fit_beside_the_held_state_is_refused(monkeypatch, cost, refusal):
  _device_memory(monkeypatch, compiled_step, GIB)
  with pytest.raises(ConfigError) as error:
    compiled_step.check_fits(cost, typed(tiny_config()))
  assert refusal in str(error.value)


def test_a_step_that_xla_cannot_fit_when_compiling_is_one_line(monkeypatch):
  # XLA:TPU refuses, when compiling, a step whose memory it cannot plan.
  class Lowered:

    def compile(self):
      raise jax.errors.JaxRuntimeError(_TPU_COMPILE)

  run = types.SimpleNamespace(
      abstract_state=None,
      parts=types.SimpleNamespace(abstract_batch=dict, settings=typed(tiny_config())),
      train_step=types.SimpleNamespace(lower=lambda *inputs: Lowered()),
  )
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  with pytest.raises(ConfigError, match=r"^The TPU's HBM ran out of memory \(it needs 21.95 GiB"):
    compiled_step.compile_train_step(run, jax.random.PRNGKey(0))
