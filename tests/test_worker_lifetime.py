"""Data worker processes end with their parent: a SIGKILL of the trainer (or
of a preparation) leaves no grain worker, tokenizing worker or
resource_tracker running (issue 61)."""

import signal
import time

import psutil
import pytest

from tests.run_helpers import tiny_flags
from tests.run_helpers import wait_for_step

# How long the orphans may take to notice: the watch wakes at once, so this is
# only slack for a loaded machine.
GONE_WITHIN_S = 10


def _alive(process: psutil.Process) -> bool:
  """Whether `process` still runs; a zombie has ended (orphans in a container
  may wait for a reaper that never comes)."""
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _command_line(process: psutil.Process):
  try:
    return process.cmdline()
  except psutil.Error:
    return []


def _kill_and_check_descendants_end(process, descendants):
  """SIGKILLs `process`; every one of `descendants` must end soon after."""
  try:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(map(_alive, descendants)) and time.monotonic() < deadline:
      time.sleep(0.1)
    left = [' '.join(_command_line(child)) for child in descendants if _alive(child)]
    assert not left, f'still running {GONE_WITHIN_S} s after the parent was killed: {left}'
  finally:
    for child in descendants:
      if _alive(child):
        child.kill()


@pytest.mark.slow
def test_a_killed_trainer_leaves_no_data_worker_running(tmp_path, run_command):
  workdir = tmp_path / 'run'
  process = run_command(
      'train',
      *tiny_flags(workdir),
      '--config.data.worker_count=1',
      '--config.total_steps=100000',
      '--config.log_every=1',
      '--config.checkpoint_every=100000',
      '--config.eval_every=100000',
      wait=False,
  )
  try:
    # The grain worker makes every batch: by step 2 it runs (a preparation's
    # tokenizing workers, which also run spawn_main, have ended by then).
    wait_for_step(workdir, 2, process)
    descendants = psutil.Process(process.pid).children(recursive=True)
  except BaseException:
    process.kill()
    raise
  command_lines = [' '.join(_command_line(child)) for child in descendants]
  assert any('spawn_main' in line for line in command_lines), command_lines
  assert any('resource_tracker' in line for line in command_lines), command_lines
  _kill_and_check_descendants_end(process, descendants)


# A preparation whose one worker is busy with a long unit: `exec` of the
# unit's text, which marks that it has begun, then sleeps for a minute.
LONG_UNIT_PREPARATION = """
import sys
from linformer_jax.data import prepare, tokenizer
unit = f'import pathlib, time; pathlib.Path({sys.argv[1]!r}).touch(); time.sleep(60)'
if __name__ == '__main__':
  list(prepare._ordered_map(exec, [unit], tokenizer.ByteTokenizer(), workers=1))
"""


@pytest.mark.slow
def test_a_killed_preparation_leaves_no_tokenizing_worker_running(tmp_path, run_python):
  begun = tmp_path / 'begun'
  process = run_python('-c', LONG_UNIT_PREPARATION, begun, wait=False)
  try:
    deadline = time.monotonic() + 60
    while not begun.exists():
      assert process.poll() is None, process.stdout.read()
      assert time.monotonic() < deadline, 'the worker never began its unit'
      time.sleep(0.1)
    descendants = psutil.Process(process.pid).children(recursive=True)
  except BaseException:
    process.kill()
    raise
  _kill_and_check_descendants_end(process, descendants)
