"""The backend a run expects (config.platform), the first line naming the one
it found, CPU-only XLA flags, and the accelerator requirement sets."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from linformer_jax import xla_cpu
from linformer_jax.errors import ConfigError
from linformer_jax.training import multihost

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_summary_names_the_backend_its_devices_and_processes():
  assert multihost.device_summary() == 'backend cpu: 1 device (cpu), 1 process'


def test_the_expected_backend_passes_and_any_other_is_refused():
  assert multihost.check_platform('') == 'cpu'
  assert multihost.check_platform('cpu') == 'cpu'
  with pytest.raises(ConfigError, match=r"platform='tpu' but JAX found the cpu backend.*tpu\.txt"):
    multihost.check_platform('tpu')
  with pytest.raises(ConfigError, match=r"platform='xpu' is not a platform; use one of"):
    multihost.check_platform('xpu')


@pytest.mark.slow
def test_a_run_on_the_wrong_backend_stops_in_one_line_and_writes_nothing(tmp_path, run_command):
  workdir = tmp_path / 'run'
  result = run_command(
      'train', '--config=configs/tiny.py', f'--workdir={workdir}', '--config.platform=gpu'
  )
  assert result.returncode == 2, result.stderr
  (error,) = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert "config.platform='gpu' but JAX found the cpu backend" in error
  assert 'requirements-gpu.txt' in error and '--config.platform=cpu' in error
  assert 'Traceback' not in result.stderr
  assert not workdir.exists()


def test_an_installed_cuda_plugin_that_cannot_start_names_the_driver(monkeypatch, tmp_path):
  driver_problem = multihost.nvidia_driver_problem
  monkeypatch.setattr(multihost, 'installed_gpu_plugin', lambda: 'jax-cuda12-plugin 0.10.2')
  monkeypatch.setattr(multihost, 'nvidia_driver_problem', lambda: 'no NVIDIA driver was found')
  with pytest.raises(ConfigError) as raised:
    multihost.check_platform('gpu')
  message = str(raised.value)
  assert 'jax-cuda12-plugin 0.10.2 is installed but could not start' in message
  assert 'no NVIDIA driver was found' in message and 'requirements-gpu' not in message
  # The driver: missing, present (its version named), or a library with no module loaded.
  missing = driver_problem(str(tmp_path / 'none'), lambda name: None)
  assert missing.startswith('no NVIDIA driver was found (no libcuda.so')
  version = tmp_path / 'version'
  version.write_text('NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01\n')
  old = driver_problem(str(version), lambda name: None)
  assert 'Kernel Module  470.82.01' in old and 'CUDA 12 needs 525.60 or newer' in old
  unloaded = driver_problem(str(tmp_path / 'none'), lambda name: 'libcuda.so.1')
  assert unloaded.startswith('libcuda.so is found but no driver is loaded')


@pytest.mark.slow
def test_with_the_cuda_plugin_installed_and_no_driver_a_gpu_run_says_so(tmp_path):
  """The plugin of `make xla-targets` on the path, on this host without a GPU."""
  targets = REPO_ROOT / '.xla-targets'
  if not (targets / '.installed').exists():
    pytest.skip('make xla-targets installs the CUDA plugin')
  if pathlib.Path('/proc/driver/nvidia/version').exists():
    pytest.skip('this host has an NVIDIA driver')
  workdir = tmp_path / 'run'
  env = {**os.environ, 'PYTHONPATH': f'{targets}:{REPO_ROOT}'}
  env.pop('JAX_PLATFORMS', None)
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'linformer_jax.train',
          '--config=configs/tiny.py',
          f'--workdir={workdir}',
          '--config.platform=gpu',
      ],
      cwd=REPO_ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 2, result.stderr[-2000:]
  (error,) = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert 'jax-cuda12-plugin' in error and 'is installed but could not start' in error
  assert 'no NVIDIA driver was found' in error
  assert not workdir.exists()


@pytest.mark.parametrize(
    'platforms, plugins, cpu',
    [
        ('cpu', ('libtpu',), True),
        ('cuda', (), False),
        ('tpu,cpu', (), False),
        ('', (), True),
        ('', ('jax_cuda12_plugin',), False),
        ('', ('libtpu',), False),
    ],
)
def test_cpu_flags_are_set_only_where_the_cpu_will_be_the_backend(
    monkeypatch, platforms, plugins, cpu
):
  monkeypatch.setenv('JAX_PLATFORMS', platforms)
  monkeypatch.setattr(
      xla_cpu.importlib.util, 'find_spec', lambda name: object() if name in plugins else None
  )
  assert xla_cpu.cpu_is_the_backend() == cpu


def pinned(path):
  """{requirement name: version} of a requirements file's `==` pins."""
  pins = {}
  for line in (REPO_ROOT / path).read_text().splitlines():
    match = re.match(r'^([A-Za-z0-9_.\-\[\]]+)==(\S+)', line.strip())
    if match:
      pins[match.group(1)] = match.group(2)
  return pins


@pytest.mark.parametrize(
    'path, requirement',
    [
        ('requirements-gpu.txt', 'jax[cuda12]'),
        ('requirements-tpu.txt', 'jax[tpu]'),
    ],
)
def test_accelerator_sets_pin_the_cpu_sets_jax(path, requirement):
  text = (REPO_ROOT / path).read_text()
  assert '-r requirements.txt' in text.splitlines()
  assert pinned(path)[requirement] == pinned('requirements.txt')['jax']
