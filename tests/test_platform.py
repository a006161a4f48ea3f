"""The backend a run expects (config.platform), the first line naming the one
it found, CPU-only XLA flags, and the accelerator requirement sets."""

import pathlib
import re

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
