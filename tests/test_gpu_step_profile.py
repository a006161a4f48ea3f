"""experiments/gpu_step_profile.py runs on the CPU (a 2-layer float32 model)
and its kernel summary reads the trace it took."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.long
def test_the_step_profile_times_and_summarises_a_small_step(repo_root):
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'experiments.gpu_step_profile',
          '--small',
          '--max_len=256',
          '--batch=2',
          '--top=3',
      ],
      cwd=repo_root,
      capture_output=True,
      text=True,
      check=True,
      timeout=600,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  ).stdout
  result = json.loads(out.split('RESULT ', 1)[1].splitlines()[0])
  assert result['n'] == 256 and result['batch'] == 2 and result['kernel'] == 'einsum'
  assert result['step_ms'] > 0 and len(result['window_ms']) == 3
  assert result['tokens_per_s'] == pytest.approx(2 * 256 / (result['step_ms'] / 1e3), rel=0.01)
  kernels = out.split('kernels, ms per step:\n', 1)[1].strip().splitlines()
  assert len(kernels) == 3 and all(float(line.split()[0]) >= 0 for line in kernels)


def test_unexpected_arguments_are_refused(repo_root):
  run = subprocess.run(
      [sys.executable, '-m', 'experiments.gpu_step_profile', 'stray'],
      cwd=repo_root,
      capture_output=True,
      text=True,
      timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert run.returncode != 0 and 'every setting is a --flag' in run.stderr
