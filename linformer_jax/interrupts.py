"""Ctrl-C (SIGINT) and SIGTERM at any moment of a command: one line, exit 130 or 143.

A training loop takes both signals over while it runs and saves the step it
reached before it exits (`training.trainer`). Everywhere else (the flags
parsed, the data read, the model built, its step compiled, a reader's work)
there is nothing of a run to save, so the command stops at once with one line
on stderr and the exit code a shell gives the signal: 128 + 2 for Ctrl-C,
128 + 15 for SIGTERM. A scheduler's SIGTERM thus reads as a preemption, never
as a crash.

`install()` (run as a command's process is set up, before JAX is imported:
command_process.py) handles both signals from then on. Inside
`raising()` (the command runner's whole run) they raise `Interrupted` in the
main thread, so the usual `finally` blocks and context managers (the
workdir's lock, undoing a refused run's folders) run before `exit_for` prints
the line and ends the process with `os._exit`: letting the interpreter shut
down instead while XLA's threads are still compiling ends in a segmentation
fault. Outside it (modules still importing), and for a second signal, the
process ends at once with the same line.

Python runs a signal handler only when the main thread returns to Python
code, and compiling a large step keeps it in XLA for minutes. So a watcher
thread hears every signal at once (through `signal.set_wakeup_fd`); if the
main thread has not taken it within GRACE_SECONDS, and no training loop holds
the signals (`held_by_loop`), the watcher prints the line and exits itself. It
also ends a process whose clean-up is still running DEADLINE_SECONDS after the
main thread took the signal.

Python also runs the handler inside code whose exceptions it cannot raise: a
garbage-collector callback (JAX registers one), a `__del__`, a weakref
callback. It reports the `Interrupted` raised there as "Exception ignored"
and goes on, so the signal would be lost: a Ctrl-C during a step's compile
then let the whole run train to its end. Such an `Interrupted` is delivered
again instead (`_deliver_unraised`), and the main thread takes it in the
next ordinary code it runs. A signal lost some other way (a library's
`except BaseException:`) still ends the process when a training loop is
about to take the signals over (`held_by_loop`): the run has saved nothing
yet.

With several processes, `jax.distributed.initialize` installs JAX's own
SIGTERM handler (its preemption sync manager) after this one: SIGTERM then
reaches the training loop's sync point, and only Ctrl-C is handled here.
"""

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAMES = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}
# How long the main thread has to take a signal before the watcher ends the
# process itself: Python code takes it within milliseconds, native code
# (XLA compiling a step) not before it returns.
GRACE_SECONDS = 1.0
# How long the clean-up after a taken signal may run before the watcher ends
# the process itself.
DEADLINE_SECONDS = 30.0


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM, raised in the main thread (a KeyboardInterrupt, so
  that code stopping on Ctrl-C stops on SIGTERM too)."""

  def __init__(self, signum: int):
    super().__init__(NAMES.get(signum, f'signal {signum}'))
    self.signum = signum


def exit_code(signum: int) -> int:
  """What a shell reports for a process ended by `signum`: 128 + its number."""
  return 128 + int(signum)


def describe(signum: int) -> str:
  return NAMES.get(signum, f'signal {signum}')


class _State:
  """What the handler and the watcher share."""

  def __init__(self):
    self.lock = threading.Lock()
    self.received = 0  # signals the watcher has heard
    self.taken = 0  # signals the main thread has taken
    self.taken_signum: Optional[int] = None  # the first signal it took
    # A signal taken where Python could not raise, to be delivered again.
    self.unraised: Optional[int] = None
    self.in_unraisable_hook = False
    self.loop_holds = 0  # training loops holding the signals (nested: a count)
    self.raising = 0  # open `raising()` blocks: a runner catches `Interrupted`
    self.exiting = False


_STATE = _State()
_INSTALLED = False


def stop_line(signum: int) -> str:
  """The line a command stopped by `signum` outside a training loop prints."""
  return (
      f'interrupted ({describe(signum)}): stopped before anything was saved; run the same '
      'command again to start or go on.'
  )


def exit_for(signum: int, line: Optional[str] = None) -> None:
  """Prints `line` (default `stop_line`) and ends the process with the
  signal's exit code, at once: no interpreter shutdown (see the module's
  docstring). Only the first caller prints; the others wait to be ended."""
  with _STATE.lock:
    first = not _STATE.exiting
    _STATE.exiting = True
  if first:
    print(line or stop_line(signum), file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
      sys.stdout.flush()
    os._exit(exit_code(signum))  # pylint: disable=protected-access
  while True:  # the other caller is printing and ending the process
    time.sleep(1.0)


def exit_within(seconds: float, code: int) -> None:
  """Ends the process with `code` if it is still alive `seconds` from now: a
  command that has said why it stops (its one line printed) must not be kept
  alive by a library's thread that never ends (orbax's, after a background
  save failed). The interpreter's own shutdown goes first."""

  def end() -> None:
    time.sleep(seconds)
    with contextlib.suppress(Exception):
      sys.stdout.flush()
      sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access

  threading.Thread(target=end, name='exit-deadline', daemon=True).start()


def _raise_in_main_thread(signum, frame) -> None:
  del frame
  with _STATE.lock:
    _STATE.taken += 1
    if _STATE.in_unraisable_hook:
      # Python cannot raise here either: the thread the hook started
      # delivers this signal again once the hook has returned.
      _STATE.unraised = signum
      return
    again = _STATE.taken_signum is not None
    if not again:
      _STATE.taken_signum = signum
    caught = _STATE.raising > 0
  if again or not caught:
    exit_for(signum)
  raise Interrupted(signum)


def _deliver_unraised(unraisable, previous) -> None:
  """sys.unraisablehook: an `Interrupted` that Python could not raise (see the
  module's docstring) is delivered to the main thread again, as the same
  signal not yet taken; any other report goes to `previous`."""
  error = unraisable.exc_value
  if not isinstance(error, Interrupted):
    previous(unraisable)
    return
  with _STATE.lock:
    if _STATE.exiting:
      return
    _STATE.taken_signum = None
    _STATE.unraised = error.signum
    _STATE.in_unraisable_hook = True
  try:
    threading.Thread(target=_deliver_again, name='signal-again', daemon=True).start()
  finally:
    with _STATE.lock:
      _STATE.in_unraisable_hook = False


def _deliver_again() -> None:
  """Once the unraisable hook has returned, delivers its signal to the main
  thread as the signal itself would: the handler runs in the next ordinary
  code, and the watcher hears it (in native code, it ends the process)."""
  while True:
    with _STATE.lock:
      if not _STATE.in_unraisable_hook:
        signum, _STATE.unraised = _STATE.unraised, None
        break
    time.sleep(0.001)
  if signum is not None:
    _thread.interrupt_main(signum)


def _watch(read_fd: int) -> None:
  """The watcher thread: ends the process for a signal the main thread does
  not take in time (see the module's docstring)."""
  while True:
    try:
      data = os.read(read_fd, 64)
    except InterruptedError:
      continue
    except OSError:
      return
    signums = [number for number in data if number in SIGNALS]
    if not signums:
      continue
    with _STATE.lock:
      _STATE.received += len(signums)
      received = _STATE.received
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
      with _STATE.lock:
        if _STATE.loop_holds or _STATE.taken >= received:
          break
      time.sleep(0.02)
    with _STATE.lock:
      stuck = not _STATE.loop_holds and _STATE.taken < received
    if stuck:
      exit_for(signums[-1])
    threading.Thread(target=_end_slow_clean_up, args=(signums[-1],), daemon=True).start()


def _end_slow_clean_up(signum: int) -> None:
  """Ends the process if it is still alive DEADLINE_SECONDS after the main
  thread took a signal outside a training loop."""
  time.sleep(DEADLINE_SECONDS)
  with _STATE.lock:
    slow = not _STATE.loop_holds and _STATE.taken_signum is not None
  if slow:
    exit_for(signum)


def install() -> None:
  """Handles SIGINT and SIGTERM from now on (see the module's docstring) and
  starts the watcher thread. For a command's process only, from its main
  thread: a library user's process is left alone."""
  global _INSTALLED
  if _INSTALLED or threading.current_thread() is not threading.main_thread():
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  for signum in SIGNALS:
    signal.signal(signum, _raise_in_main_thread)
  previous_hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: _deliver_unraised(unraisable, previous_hook)
  threading.Thread(target=_watch, args=(read_fd,), name='signal-watcher', daemon=True).start()
  _INSTALLED = True


@contextlib.contextmanager
def raising() -> Iterator[None]:
  """While the block runs, SIGINT and SIGTERM raise `Interrupted` in the main
  thread (its caller ends the process with `exit_for`)."""
  with _STATE.lock:
    _STATE.raising += 1
  try:
    yield
  finally:
    with _STATE.lock:
      _STATE.raising -= 1


@contextlib.contextmanager
def held_by_loop() -> Iterator[None]:
  """While a training loop handles the signals itself (it saves the step it
  reached, then exits), the watcher leaves them to it.

  A signal the main thread took before and that has not ended the process
  was lost on its way (see the module's docstring): the process ends here,
  before the loop saves anything."""
  with _STATE.lock:
    lost = None if _STATE.exiting else (_STATE.taken_signum or _STATE.unraised)
  if lost is not None:
    exit_for(lost)
  with _STATE.lock:
    _STATE.loop_holds += 1
  try:
    yield
  finally:
    with _STATE.lock:
      _STATE.loop_holds -= 1
