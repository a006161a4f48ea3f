"""Ctrl-C and SIGTERM at any moment of a command end it in one line with exit
130 or 143 (linformer_jax/interrupts.py); the training loop's own save on a
signal is tested in test_train.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import REPO_ROOT
import pytest

from linformer_jax import command_process
from linformer_jax import interrupts

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}
SIGNALS = pytest.mark.parametrize('signum', list(EXIT_CODES), ids=['ctrl-c', 'sigterm'])


def start(*args: str) -> subprocess.Popen:
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.Popen(
      [sys.executable, *args],
      cwd=REPO_ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )


def wait_for_line(process: subprocess.Popen, words: str, timeout: float = 120) -> list:
  """The stdout lines up to and including the first one holding `words`."""
  lines = []
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    line = process.stdout.readline()
    if not line:
      break
    lines.append(line)
    if words in line:
      return lines
  process.kill()
  raise AssertionError(f'no line with {words!r}: {lines} {process.stderr.read()}')


def assert_stopped_in_one_line(process: subprocess.Popen, signum: int, within: float) -> str:
  """The process exits with the signal's code within `within` seconds, with
  exactly one stderr line naming the signal and no traceback or crash."""
  start_time = time.monotonic()
  code = process.wait(timeout=120)
  took = time.monotonic() - start_time
  stdout, stderr = process.communicate()
  output = stdout + stderr
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == EXIT_CODES[signum], output
  assert len(lines) == 1 and f'interrupted ({NAMES[signum]})' in lines[0], output
  assert 'Traceback' not in output and 'Fatal Python error' not in output, output
  assert took < within, f'exited {took:.1f} s after the signal'
  return stdout


@pytest.mark.slow
@SIGNALS
def test_a_signal_while_the_step_compiles_ends_training_in_one_line(tmp_path, signum):
  """Before this, Ctrl-C here crashed (exit -11, a segmentation fault at the
  interpreter's shutdown) and SIGTERM killed it without a word (-15)."""
  workdir = tmp_path / 'run'
  process = start(
      '-m',
      'linformer_jax.train',
      '--config=configs/tiny.py',
      f'--workdir={workdir}',
      # Eight unscanned layers: a compile of seconds, not a fraction of one.
      '--config.model.num_layers=8',
      '--config.model.scan_layers=False',
  )
  wait_for_line(process, 'parameters, attention kernel')  # printed just before the compile
  time.sleep(0.3)
  process.send_signal(signum)
  stdout = assert_stopped_in_one_line(process, signum, within=30)
  assert 'train step compiled' not in stdout, 'the signal came after the compile'
  assert not workdir.exists(), 'a run stopped before its first step leaves no folder'


STUCK_MAIN_THREAD = textwrap.dedent("""
    import signal, time
    from linformer_jax import interrupts
    interrupts.install()
    # As when XLA compiles for minutes: the signal reaches another thread and
    # the main thread does not run Python code (the handler) until it returns.
    signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)
    with interrupts.raising():
      print('stuck', flush=True)
      time.sleep(60)
    print('woke up', flush=True)
""")


@pytest.mark.slow
@SIGNALS
def test_a_main_thread_stuck_in_native_code_is_ended_by_the_watcher(signum):
  process = start('-c', STUCK_MAIN_THREAD)
  wait_for_line(process, 'stuck', timeout=60)
  # Until its print returns, the main thread still runs Python code and takes
  # the signal itself; a second later it is asleep.
  time.sleep(1.0)
  process.send_signal(signum)
  stdout = assert_stopped_in_one_line(process, signum, within=interrupts.GRACE_SECONDS + 10)
  assert 'woke up' not in stdout


# The handler runs inside code whose exceptions Python cannot raise, where it
# reports "Exception ignored" and goes on: as when JAX's garbage-collector
# callback runs during a step's compile. argv: the signal, then where.
TAKEN_WHERE_PYTHON_CANNOT_RAISE = textwrap.dedent("""
    import gc, signal, sys, time
    from linformer_jax import interrupts
    interrupts.install()
    signum, where = int(sys.argv[1]), sys.argv[2]

    class Dropped:
      def __del__(self):
        signal.raise_signal(signum)

    def collecting(phase, info):
      gc.callbacks.remove(collecting)
      signal.raise_signal(signum)

    with interrupts.raising():
      try:
        if where == 'gc-callback':
          gc.callbacks.append(collecting)
          gc.collect()
        else:
          Dropped()  # dropped at once: its __del__ runs here
        time.sleep(60)
        print('slept through the signal', flush=True)
      except KeyboardInterrupt as error:
        interrupts.exit_for(error.signum)
""")


@pytest.mark.parametrize('where', ['gc-callback', '__del__'])
@SIGNALS
def test_a_signal_taken_where_python_cannot_raise_still_ends_the_command(signum, where):
  """Before this, the signal was reported as "Exception ignored" and lost: a
  Ctrl-C during a step's compile let the run train to its end."""
  process = start('-c', TAKEN_WHERE_PYTHON_CANNOT_RAISE, str(int(signum)), where)
  stdout = assert_stopped_in_one_line(process, signum, within=20)
  assert 'slept through the signal' not in stdout


SWALLOWED_BEFORE_A_LOOP = textwrap.dedent("""
    import signal, sys
    from linformer_jax import interrupts
    interrupts.install()
    with interrupts.raising():
      try:
        try:
          signal.raise_signal(int(sys.argv[1]))
        except BaseException:
          pass  # as a library that catches everything
        with interrupts.held_by_loop():
          print('the loop ran', flush=True)
      except KeyboardInterrupt as error:
        interrupts.exit_for(error.signum)
""")


@SIGNALS
def test_a_signal_lost_before_a_training_loop_ends_the_command_before_it(signum):
  process = start('-c', SWALLOWED_BEFORE_A_LOOP, str(int(signum)))
  stdout = assert_stopped_in_one_line(process, signum, within=20)
  assert 'the loop ran' not in stdout


SECOND_SIGNAL = textwrap.dedent("""
    import time
    from linformer_jax import interrupts
    interrupts.install()
    with interrupts.raising():
      try:
        print('running', flush=True)
        time.sleep(60)
      except KeyboardInterrupt:
        print('cleaning up', flush=True)
        time.sleep(60)  # a clean-up that hangs
""")


@pytest.mark.slow
def test_a_second_signal_during_clean_up_ends_the_process_at_once():
  process = start('-c', SECOND_SIGNAL)
  wait_for_line(process, 'running', timeout=60)
  process.send_signal(signal.SIGINT)
  wait_for_line(process, 'cleaning up', timeout=30)
  process.send_signal(signal.SIGTERM)
  assert_stopped_in_one_line(process, signal.SIGTERM, within=10)


def test_only_this_package_s_commands_handle_signals():
  assert not command_process.is_being_started()  # pytest's process
  assert signal.getsignal(signal.SIGTERM) is not interrupts._raise_in_main_thread  # pylint: disable=protected-access
  assert interrupts.exit_code(signal.SIGINT) == 130
  assert interrupts.exit_code(signal.SIGTERM) == 143


A_THREAD_THAT_NEVER_ENDS = textwrap.dedent("""
    import threading
    from linformer_jax import cli

    def main(argv):
      # As orbax's save thread after making its folder failed: never ends.
      threading.Thread(target=threading.Event().wait).start()
      cli.fail('a refused command')

    cli.run(main)
""")


@pytest.mark.slow
def test_a_refused_command_ends_even_when_a_library_thread_never_does():
  """Before this, the `error:` line was printed and the process waited forever."""
  process = start('-c', A_THREAD_THAT_NEVER_ENDS)
  started = time.monotonic()
  code = process.wait(timeout=60)
  _, stderr = process.communicate()
  assert code == 2, stderr
  assert stderr.strip() == 'error: a refused command'
  assert time.monotonic() - started < 30
