"""What the command-line entry points share: config flags and one-line errors.

A mistake in what the user asked for (an unknown config key, a bad value, a
missing data path, a workdir holding a different model) ends the program with a
one-line message saying what to change and exit code 2, before anything in the
workdir is written.
"""

import os
import sys
from typing import Callable, List

# TensorFlow (imported by the TensorBoard writer) prints C++ start-up notices;
# it only writes summaries here, so its oneDNN kernels are not needed either.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags

from linformer_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top,wrong-import-position
from linformer_jax.training import multihost  # pylint: disable=g-import-not-at-top,wrong-import-position

USAGE_ERROR_EXIT_CODE = 2


def define_config_flags() -> None:
  """Defines --config (a Python config file, overridable per field) and --workdir."""
  config_flags.DEFINE_config_file(
      'config',
      None,
      'Config file, e.g. configs/default.py; any field can be '
      'overridden as --config.model.projected_len=64.',
      lock_config=True,
  )
  flags.DEFINE_string(
      'workdir', None, 'Directory of the run: checkpoints, metrics, TensorBoard events, results.'
  )
  flags.mark_flags_as_required(['config', 'workdir'])
  flags.DEFINE_string(
      'coordinator_address',
      '',
      'Multi-process runs: HOST:PORT of '
      'process 0 (or JAX_COORDINATOR_ADDRESS); not needed on TPU '
      'pods, SLURM or Open MPI.',
  )
  flags.DEFINE_integer(
      'num_processes', None, 'Multi-process runs: how many processes (or JAX_NUM_PROCESSES).'
  )
  flags.DEFINE_integer(
      'process_id',
      None,
      'Multi-process runs: this process, 0 .. num_processes - 1 (or JAX_PROCESS_ID).',
  )
  flags.DEFINE_enum(
      'cpu_collectives',
      '',
      ['', 'gloo', 'mpi'],
      'CPU-only multi-process runs: the collectives library.',
  )


def start_processes() -> None:
  """Connects to the other processes of a multi-process run, if any."""
  multihost.initialize(
      flags.FLAGS.coordinator_address,
      flags.FLAGS.num_processes,
      flags.FLAGS.process_id,
      flags.FLAGS.cpu_collectives,
  )


def fail(message: str) -> None:
  """Prints a one-line error and exits with the usage-error code."""
  print(f'error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR_EXIT_CODE)


def int_list(flag: str, values: List[str]) -> List[int]:
  """The values of a comma-separated list flag as ints; ConfigError naming the flag."""
  try:
    return [int(value) for value in values]
  except ValueError:
    raise ConfigError(
        f'--{flag}={",".join(values)} is not allowed: give comma-separated integers.'
    ) from None


def _parse_flags(argv: List[str]) -> List[str]:
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as error:
    fail(f'{error} (see --helpfull)')


def run(main: Callable[[List[str]], None]) -> None:
  """Runs main like absl.app.run, with bad input reported as exit code 2."""

  def guarded_main(argv):
    # Progress, evaluations and results are printed; library INFO logs (orbax
    # writes a dozen lines per checkpoint) only with --verbosity=0.
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)
    try:
      main(argv)
    except ConfigError as error:
      fail(error)

  app.run(guarded_main, flags_parser=_parse_flags)
