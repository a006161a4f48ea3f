"""A command run as a child process, timed, with the peak resident memory of it and
its own children sampled while it runs; and any figure summed over a process tree."""

import contextlib
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from typing import Callable, List, NamedTuple, Optional, Sequence

import psutil

from linformer_jax.errors import ConfigError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# The commands' exit code for a one-line usage error (cli.USAGE_ERROR_EXIT_CODE;
# libraries do not import the command layer).
USAGE_ERROR_EXIT_CODE = 2
# How often `peak_tree_rss` samples.
SAMPLE_INTERVAL_S = 0.05


def tree_total(process: psutil.Process, read: Callable[[psutil.Process], float]) -> float:
  """`read` summed over a process and its descendants that are alive now;
  a member that exits between the listing and the reading counts 0."""
  try:
    members = [process, *process.children(recursive=True)]
  except psutil.Error:
    return 0
  total = 0
  for member in members:
    with contextlib.suppress(psutil.Error):
      total += read(member)
  return total


def peak_tree_rss(popen: subprocess.Popen, interval_s: float = SAMPLE_INTERVAL_S) -> int:
  """The largest resident bytes of a running process and all its descendants,
  summed, sampled every interval_s until it exits (pages they share count once
  per process, as `ps` shows them)."""
  process = psutil.Process(popen.pid)
  peak = 0
  while popen.poll() is None:
    peak = max(peak, int(tree_total(process, lambda member: member.memory_info().rss)))
    time.sleep(interval_s)
  return peak


class Measurement(NamedTuple):
  """What `run_measured` measures of a command."""

  wall_s: float  # from start to exit
  peak_rss_bytes: int  # of the process tree
  marker_s: Optional[float]  # from start to the first line matching the marker


def run_measured(
    arguments: Sequence[str], log_path: pathlib.Path, marker: Optional[str] = None
) -> Measurement:
  """Runs `python ARGUMENTS` (e.g. ['-m', 'linformer_jax.train', ...]) in the
  repository root, its stdout and stderr to log_path; `marker` is a regular
  expression for `marker_s`. A usage error (exit code 2) raises a ConfigError,
  any other failure a RuntimeError."""
  log_path.parent.mkdir(parents=True, exist_ok=True)
  path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get('PYTHONPATH')]))
  pattern = re.compile(marker) if marker else None
  marker_times: List[float] = []
  start = time.perf_counter()
  popen = subprocess.Popen(
      [sys.executable, *arguments],
      cwd=REPO_ROOT,
      env={**os.environ, 'PYTHONPATH': path},
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
  )

  def copy_output():
    with open(log_path, 'w') as log:
      for line in popen.stdout:
        if pattern and not marker_times and pattern.search(line):
          marker_times.append(time.perf_counter() - start)
        log.write(line)

  reader = threading.Thread(target=copy_output, daemon=True)
  reader.start()
  peak = peak_tree_rss(popen)
  wall_s = time.perf_counter() - start
  reader.join()
  if popen.returncode:
    lines = log_path.read_text().strip().splitlines() or ['(no output)']
    errors = [line[len('error:') :].strip() for line in lines if line.startswith('error:')]
    if popen.returncode == USAGE_ERROR_EXIT_CODE and errors:
      raise ConfigError(f'{arguments[1]}: {errors[-1]}')
    raise RuntimeError(
        f'{" ".join(arguments[:2])} failed with exit code {popen.returncode}: '
        f'{lines[-1]} (log: {log_path})'
    )
  return Measurement(wall_s, peak, marker_times[0] if marker_times else None)
