"""The rival attention kinds at scale: a train step on a (2, 2) mesh of 4 CPU
devices gives the losses of one device, and the step compiles for an H100 and
a TPU v5e slice (`mesh_memory --target`, compiled, never run).

Each check starts its own processes (the device count is fixed when JAX
starts); `make test` runs one kind's mesh check, `make test-all` every kind.
"""

import os
import subprocess
import sys

import pytest

from linformer_jax.model import attention_kinds
from linformer_jax.training.metric_writers import read_metrics
from tests.run_helpers import tiny_flags
from tests.test_xla_targets import _mesh_memory
from tests.test_xla_targets import _rows
from tests.test_xla_targets import plugins  # noqa: F401  pylint: disable=unused-import

# The built-in kinds but the two the rest of the suite checks at scale.
RIVALS = tuple(name for name in attention_kinds.BUILT_IN if name not in ('full', 'linformer'))
REPRESENTATIVE = 'performer'  # fixed random features in the 'constants' collection
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(workdir, kind, devices, mesh_shape):
  """Two steps of configs/tiny.py with `kind` on `devices` fake CPU devices."""
  env = {**os.environ, 'PYTHONPATH': REPO, 'JAX_PLATFORMS': 'cpu'}
  env['XLA_FLAGS'] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'linformer_jax.train',
          *tiny_flags(workdir),
          f'--config.model.attention={kind}',
          '--config.model.attention_dropout_rate=0.0',
          f'--config.mesh_shape={mesh_shape}',
          '--config.total_steps=2',
          '--config.warmup_steps=1',
          '--config.log_every=1',
          '--config.eval_every=2',
          '--config.checkpoint_every=2',
      ],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return {m['step']: m['train_loss'] for m in read_metrics(str(workdir)) if 'train_loss' in m}


@pytest.mark.slow
@pytest.mark.parametrize(
    'kind', [pytest.param(k, marks=() if k == REPRESENTATIVE else pytest.mark.long) for k in RIVALS]
)
def test_a_train_step_on_a_mesh_of_four_devices_gives_one_devices_losses(tmp_path, kind):
  """Batch over 'data' and heads (and the MLP) over 'model', with the kind's
  constants and parameters split by their logical axes."""
  sharded = _train(tmp_path / 'mesh', kind, 4, '(2, 2)')
  single = _train(tmp_path / 'one', kind, 1, '(1, 1)')
  assert sorted(sharded) == [1, 2]
  for step, loss in single.items():
    assert sharded[step] == pytest.approx(loss, rel=1e-4), (step, sharded, single)


@pytest.mark.long
@pytest.mark.parametrize('kind', RIVALS)
def test_the_step_compiles_for_an_h100_and_a_v5e_slice(plugins, kind):  # noqa: F811
  del plugins
  result = _mesh_memory(
      '--target=h100',
      '--target=v5e-4',
      f'--config.model.attention={kind}',
      '--config.model.attention_dropout_rate=0.0',
      '--config.model.dtype=bfloat16',
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'since attention={kind!r} attends by its own einsums' in result.stdout
  rows = _rows(result.stdout)
  assert rows['h100'][7] == 'yes' and rows['v5e-4'][7] == 'yes', rows
