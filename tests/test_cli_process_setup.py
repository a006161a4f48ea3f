"""A command's process is set up before JAX is imported (`python -m`) or
before its backend starts (`cli.run`), and a library user's is left alone
(linformer_jax/command_process.py)."""

import os
import signal
import subprocess
import sys
import textwrap

from conftest import REPO_ROOT
import pytest

from linformer_jax import command_process
from linformer_jax import xla_cpu

NO_LIBRARY_FUSIONS = f'{xla_cpu.LIBRARY_FUSIONS_FLAG}='


def environment(**variables: str) -> dict:
  """This process's environment without XLA_FLAGS (the suite sets its own)
  nor TensorFlow's variables, on the CPU, with `variables`."""
  unset = ('XLA_FLAGS', 'TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS')
  env = {key: value for key, value in os.environ.items() if key not in unset}
  return {**env, 'JAX_PLATFORMS': 'cpu', **variables}


@pytest.mark.parametrize(
    'argv, command_line, starting',
    [
        (['-m', '--workdir=run'], ['-m', 'linformer_jax.evaluate', '--workdir=run'], True),
        (['-m'], ['-W', 'ignore', '-mlinformer_jax.train'], True),
        (['-m'], ['-Bm', 'linformer_jax.spectrum'], True),
        # Another package's module, given an argument that names one of ours.
        (['-m', 'linformer_jax.train'], ['-m', 'pytest', 'linformer_jax.train'], False),
        # The command's module already runs: Python has set argv[0] to its file.
        (['linformer_jax/train.py'], ['-m', 'linformer_jax.train'], False),
        (['-c'], ['-c', 'import linformer_jax'], False),
        (['notebook.py'], ['notebook.py'], False),
    ],
)
def test_python_starting_a_command_is_told_from_its_command_line(
    monkeypatch, argv, command_line, starting
):
  monkeypatch.setattr(sys, 'argv', argv)
  monkeypatch.setattr(sys, 'orig_argv', [sys.executable, *command_line])
  assert command_process.is_being_started() == starting


# Stands for JAX: says what its importer set up, then is interrupted.
INTERRUPTED_JAX = textwrap.dedent("""
    import os, signal, time
    print('XLA_FLAGS=' + os.environ.get('XLA_FLAGS', ''), flush=True)
    print('TF_CPP_MIN_LOG_LEVEL=' + os.environ.get('TF_CPP_MIN_LOG_LEVEL', ''), flush=True)
    os.kill(os.getpid(), signal.SIGNUM)
    time.sleep(60)
""")


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['ctrl-c', 'sigterm'])
def test_a_signal_while_a_command_imports_jax_ends_it_in_one_line(tmp_path, signum):
  (tmp_path / 'jax').mkdir()
  (tmp_path / 'jax' / '__init__.py').write_text(INTERRUPTED_JAX.replace('SIGNUM', signum.name))
  result = subprocess.run(
      [sys.executable, '-m', 'linformer_jax.train', '--config=configs/tiny.py', '--workdir=run'],
      cwd=REPO_ROOT,
      env=environment(PYTHONPATH=str(tmp_path)),
      capture_output=True,
      text=True,
      timeout=60,
  )
  name = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}[signum]
  assert result.returncode == 128 + signum, result.stderr
  assert result.stderr.strip().startswith(f'interrupted ({name})'), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert f'XLA_FLAGS={NO_LIBRARY_FUSIONS}\n' in result.stdout
  assert 'TF_CPP_MIN_LOG_LEVEL=2\n' in result.stdout


# A library user's import of a command sets nothing up; cli.run does, after
# JAX's import, and XLA still reads the flags at the first compile.
RUN_WITHOUT_PYTHON_M = textwrap.dedent("""
    import os, signal
    import jax, jax.numpy as jnp
    import linformer_jax.train
    from linformer_jax import cli, interrupts

    def set_up(when):
      handled = signal.getsignal(signal.SIGTERM) is interrupts._raise_in_main_thread
      print(when, repr(os.environ.get('XLA_FLAGS', '')), handled, flush=True)

    def main(_):
      set_up('running:')
      q = jnp.ones((2, 4, 64, 16))
      attend = lambda q: jax.nn.softmax(q @ q.swapaxes(-1, -2)) @ q
      print('fused:', '__ynn_fusion' in jax.jit(attend).lower(q).compile().as_text(), flush=True)

    set_up('imported:')
    cli.run(main)
""")


def test_a_command_run_without_python_m_is_set_up_before_its_backend_starts():
  result = subprocess.run(
      [sys.executable, '-c', RUN_WITHOUT_PYTHON_M],
      cwd=REPO_ROOT,
      env=environment(),
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines() == [
      "imported: '' False",
      f"running: '{NO_LIBRARY_FUSIONS}' True",
      'fused: False',
  ]
