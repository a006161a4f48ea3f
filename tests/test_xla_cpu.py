"""The entry points' XLA:CPU setting: YNNPACK fusions off unless XLA_FLAGS chooses."""

import os
import subprocess
import sys

import pytest

from linformer_jax import xla_cpu

# A command (cli.run, as every entry point) that compiles an attention block
# and prints whether XLA:CPU handed any of it to YNNPACK.
_PROBE = """
import jax, jax.numpy as jnp
from linformer_jax import cli

def main(_):
  q = jnp.ones((2, 4, 64, 16))
  attend = lambda q: jax.nn.softmax(q @ q.swapaxes(-1, -2)) @ q
  print('__ynn_fusion' in jax.jit(attend).lower(q).compile().as_text())

cli.run(main)
"""


@pytest.mark.parametrize(
    'before, after',
    [
        ('', '--xla_cpu_experimental_ynn_fusion_type='),
        (
            '--xla_force_host_platform_device_count=8',
            '--xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type=',
        ),
        # The user's own choice stays.
        (
            '--xla_cpu_experimental_ynn_fusion_type=dot',
            '--xla_cpu_experimental_ynn_fusion_type=dot',
        ),
    ],
)
def test_disable_library_fusions_adds_the_flag_unless_set(monkeypatch, before, after):
  monkeypatch.setenv('XLA_FLAGS', before)
  xla_cpu.disable_library_fusions()
  xla_cpu.disable_library_fusions()  # idempotent
  assert os.environ['XLA_FLAGS'] == after


@pytest.mark.slow
@pytest.mark.parametrize(
    'xla_flags, fused',
    [(None, False), ('--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce', True)],
)
def test_the_training_entry_point_compiles_without_library_fusions(xla_flags, fused):
  env = {key: value for key, value in os.environ.items() if key != 'XLA_FLAGS'}
  if xla_flags:
    env['XLA_FLAGS'] = xla_flags
  result = subprocess.run(
      [sys.executable, '-c', _PROBE],
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
  )
  assert result.stdout.split()[-1] == str(fused)
