"""The set-up of a command's process, done before the command's modules import JAX.

`prepare()` quiets TensorFlow's start-up notices, makes Ctrl-C and SIGTERM
end the command in one line (`interrupts.install`), and turns XLA:CPU's
library fusions off where the CPU will be the backend (`xla_cpu`).

It runs at one of two points, whichever comes first, and only once:

- `python -m linformer_jax.NAME` imports the package before the command's
  module, so the package's `__init__` calls `prepare()` when Python is
  starting one of its commands (`is_being_started`). That is before anything
  imports JAX: Ctrl-C during JAX's import already ends in one line.
- `cli.run` calls it for a command run any other way (a test's script, a
  process forked to run a command's module). JAX may be imported by then, but
  no backend has started, and XLA reads XLA_FLAGS only when JAX starts its
  first backend.

A library user's process (a notebook, a test) is left alone.
"""

import os
import sys

from linformer_jax import interrupts
from linformer_jax import xla_cpu

PACKAGE = 'linformer_jax'


def is_being_started() -> bool:
  """Whether Python is starting one of this package's commands (`python -m
  linformer_jax.NAME`) and is still importing the packages around its module.

  Until it runs the module, Python's sys.argv is '-m' and the command's own
  arguments, so its command line's argument just before those names the
  module: alone, or after -m and any other options (`-mNAME`, `-Bm NAME`).
  """
  if sys.argv[:1] != ['-m']:
    return False
  module_argument = sys.orig_argv[-len(sys.argv)]
  if module_argument.startswith('-'):
    module_argument = module_argument.partition('m')[2]
  return module_argument.split('.')[0] == PACKAGE


def prepare() -> None:
  """Sets this process up to run a command (see the module's docstring);
  calling it again does nothing more."""
  # TensorFlow (imported only by TFDS data sources) prints C++ start-up
  # notices; it only reads datasets here, so its oneDNN kernels are not
  # needed either.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  interrupts.install()
  if xla_cpu.cpu_is_the_backend():
    xla_cpu.disable_library_fusions()
