"""Runs many command-line cases cheaply: each `python -m linformer_jax.MODULE
ARGS` in its own process, forked from one that imported the libraries once.

  python tests/command_runner.py CASES.json RESULTS.json

A fresh Python spends most of a bad-input case importing JAX, orbax and the
data libraries (about 3 s on 2 busy cores). This process imports them once,
starting nothing (no JAX backend, no thread), then forks a child per case.
The child runs the command's module as `__main__` as `python -m` does
(runpy), its stdin, stdout and stderr on files, and ends as Python ends: an
uncaught exception prints its traceback and exits 1, SystemExit exits with its
code. Cases run one at a time; one that runs past CASE_TIMEOUT_S is killed.

CASES.json is a list of {"module", "args", "env"} (env: variables to set,
null to unset); RESULTS.json gets, per case, {"returncode", "stdout",
"stderr", "seconds"}.
"""

import json
import os
import runpy
import sys
import tempfile
import time

# The libraries behind the commands the tests run: imported here, once. Not
# the command modules themselves: runpy runs each afresh as __main__.
# pylint: disable=unused-import,g-import-not-at-top,g-bad-import-order
from linformer_jax import cli  # noqa: F401
from linformer_jax.analysis import sweep_report  # noqa: F401
from linformer_jax.data import masked_lm  # noqa: F401
from linformer_jax.model import attention_capture  # noqa: F401
from linformer_jax.training import evaluation  # noqa: F401
from linformer_jax.training import hf_import  # noqa: F401
from linformer_jax.training import text_generation  # noqa: F401
from linformer_jax.training import trainer  # noqa: F401

CASE_TIMEOUT_S = 120.0


def _run_in_child(case, stdout_path, stderr_path):
  """The forked child: becomes `python -m linformer_jax.MODULE ARGS`. Never
  returns; what it raises ends the process as it would end Python's."""
  for name, value in case.get('env', {}).items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
  os.dup2(os.open(stdout_path, os.O_WRONLY), 1)
  os.dup2(os.open(stderr_path, os.O_WRONLY), 2)
  sys.path[0] = os.getcwd()  # as `python -m` has it (not this file's folder)
  sys.argv = ['-m', *case['args']]
  runpy.run_module(f"linformer_jax.{case['module']}", run_name='__main__', alter_sys=True)
  sys.exit(0)


def _wait(pid, timeout_s):
  """The child's exit code (minus the signal that killed it)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    finished, status = os.waitpid(pid, os.WNOHANG)
    if finished:
      return os.waitstatus_to_exitcode(status)
    time.sleep(0.02)
  os.kill(pid, 9)
  return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main(cases_path, results_path):
  with open(cases_path) as f:
    cases = json.load(f)
  folder = tempfile.mkdtemp(prefix='command_runner_')
  results = []
  for number, case in enumerate(cases):
    stdout_path = os.path.join(folder, f'{number}.out')
    stderr_path = os.path.join(folder, f'{number}.err')
    for path in (stdout_path, stderr_path):
      open(path, 'w').close()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
      _run_in_child(case, stdout_path, stderr_path)
    returncode = _wait(pid, CASE_TIMEOUT_S)
    with open(stdout_path) as out, open(stderr_path) as err:
      results.append(
          {
              'returncode': returncode,
              'stdout': out.read(),
              'stderr': err.read(),
              'seconds': time.monotonic() - start,
          }
      )
  with open(results_path, 'w') as f:
    json.dump(results, f)


if __name__ == '__main__':
  main(*sys.argv[1:])
