"""Worker processes that end with the process that started them.

A worker that `multiprocessing` starts with 'spawn' (grain's and
`prepare`'s) is not told when its parent dies by SIGKILL: a grain worker
keeps polling its full output queue, and a tokenizing worker finishes its
unit before it finds the pipe broken. Each holds the resource_tracker open
too, which ends only when all its holders have.

`end_with_parent`, called in the worker, starts a thread that joins
`multiprocessing.parent_process()`: it waits on the parent's sentinel, a
pipe whose write end only the parent holds, which the kernel closes when the
parent process ends, however it ends (on Linux and macOS alike; a process
handle on Windows). A parent that died before the call has already closed
it, so there is no window to miss. Linux's PR_SET_PDEATHSIG would fire when
the starting *thread* ends instead, and grain starts its workers from a
prefetch thread.
"""

import multiprocessing
import multiprocessing.process
import os
import threading

# The exit status of a worker whose parent has gone (no one reads it).
_ORPHANED_EXIT_STATUS = 1


def _exit_when_gone(parent: multiprocessing.process.BaseProcess) -> None:
  parent.join()
  # os._exit, not sys.exit: sys.exit would end only this thread, and a
  # normal shutdown would wait on queue threads writing to the dead parent.
  os._exit(_ORPHANED_EXIT_STATUS)


def end_with_parent(parent_pid: int) -> None:
  """Ends this process as soon as its parent ends, if it is a multiprocessing
  worker of process `parent_pid`; otherwise does nothing (the same process, a
  process started another way, a worker of another process)."""
  parent = multiprocessing.parent_process()
  if parent is None or parent.pid != parent_pid:
    return
  threading.Thread(
      target=_exit_when_gone, args=(parent,), name='end-with-parent', daemon=True
  ).start()
