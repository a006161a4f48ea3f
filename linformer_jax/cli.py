"""What the command-line entry points share: config flags and one-line errors.

A mistake in what the user asked for (an unknown config key, a bad value, a
missing data path, a workdir holding a different model, a path that cannot be
written, a path that is not valid UTF-8, a gs:// path without credentials or
network) ends the program with a one-line message `error: ...` saying what to
change and exit code 2, before anything in the workdir is written. A `~` in a
path flag or a config field that names a path is the home folder, as the
shell would have made it at the start of a word. A command that prints
results before saving them (evaluate, spectrum, projection_stats) saves them
inside `saving_printed_results`: a file it cannot write then ends the command
in one line that says the printed results were not saved.
"""

import contextlib
import copy
import errno
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import traceback
from typing import Any, Callable, Iterator, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

from linformer_jax import command_process
from linformer_jax import interrupts
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import ConfigError
from linformer_jax.errors import free_space_of
from linformer_jax.errors import is_disk_full
from linformer_jax.extensions import flag_arguments
from linformer_jax.extensions import import_command_extensions
from linformer_jax.extensions import import_extensions
from linformer_jax.flag_errors import flag_error_words
from linformer_jax.training import compilation_cache
from linformer_jax.training import memory_budget
from linformer_jax.training import multihost
from linformer_jax.training import run_builder
from linformer_jax.training import run_config

USAGE_ERROR_EXIT_CODE = 2
# The flag that lists the config's fields from their declarations.
HELP_CONFIG = 'helpconfig'
# How long a command that failed may take to shut down before it is ended.
EXIT_DEADLINE_SECONDS = 5.0
# An OSError the user fixes by changing a path or its permissions: a read-only
# filesystem, no permission, a file where a folder belongs or the other way round.
_PATH_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST)
# The flags the functions below define belong to the command that calls them,
# so that its --help lists them.
flags.disclaim_key_flags()


class ConfigFileError(Exception):
  """A --config file that cannot be loaded.

  Not a ValueError: absl would rewrite that into a message about the flag value.
  """


@contextlib.contextmanager
def _running_config_code(flag: str, path: str) -> Iterator[None]:
  """Turns any exception of the config file's own code into a `ConfigFileError`
  naming the flag, the exception and its line in the file at `path`."""
  try:
    yield
  except Exception as error:  # pylint: disable=broad-exception-caught
    if isinstance(error, SyntaxError):
      line = error.lineno
      message = error.msg
    else:
      lines = [
          frame.lineno
          for frame in traceback.extract_tb(error.__traceback__)
          if os.path.abspath(frame.filename) == os.path.abspath(path)
      ]
      line = lines[-1] if lines else None
      message = str(error)
    where = f' (line {line})' if line else ''
    raise ConfigFileError(
        f'{flag} cannot be loaded: {type(error).__name__}: {message}{where}'
    ) from None


class ConfigFileParser(flags.ArgumentParser):
  """Loads --config=FILE[:ARGUMENT] as ml_collections does, but strictly.

  ml_collections puts off a missing file's error until the config is first
  read (after the workdir is made) and wraps the others in a traceback; here a
  file that cannot be loaded, or whose get_config() does not return a
  ConfigDict, is a `ConfigFileError` while the flags are parsed.

  With `reads_run`, for a command that reads the run in --workdir (evaluate,
  generate, spectrum, projection_stats), --config defaults to that run's own
  config.json (`define_config_flags`).
  """

  def __init__(self, name: str, reads_run: bool = False):
    self.name = name
    self.reads_run = reads_run

  def flag_type(self) -> str:
    return 'config object'

  def parse(self, argument: str) -> ml_collections.ConfigDict:
    flag = f'--{self.name}={argument}'
    config_from_workdir = self.config_from_workdir(sys.argv)
    from_workdir = bool(config_from_workdir) and argument == config_from_workdir
    try:
      storage.check_name(argument, '--workdir' if from_workdir else f'--{self.name}')
    except ConfigError as error:
      raise ConfigFileError(str(error)) from None
    if from_workdir:
      return self._run_config(argument, flag=None)
    # `~` is the home folder, also where the shell leaves it (after = or :).
    argument = ':'.join(os.path.expanduser(part) for part in argument.split(':', 1))
    if storage.is_object_store(argument) or os.path.isdir(argument):
      return self._run_config(argument, flag=flag)
    path, *config_argument = argument.split(':', 1)
    if not os.path.isfile(path):
      problem = 'not a file' if os.path.exists(path) else 'no such file'
      raise ConfigFileError(f'{flag}: {problem}; pass a config file such as configs/default.py.')
    module_name = f'{self.name}_config'
    loader = importlib.machinery.SourceFileLoader(module_name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader))
    sys.modules[module_name] = module
    with _running_config_code(flag, path):
      loader.exec_module(module)
    get_config = getattr(module, 'get_config', None)
    if not callable(get_config):
      raise ConfigFileError(f'{flag}: the file defines no get_config() function.')
    with _running_config_code(flag, path):
      config = get_config(*config_argument)
    if not isinstance(config, ml_collections.ConfigDict):
      returned = 'None' if config is None else type(config).__name__
      raise ConfigFileError(
          f'{flag}: get_config() returned {returned}, not an ml_collections.ConfigDict; '
          'make it return the config it builds.'
      )
    run_config.complete(config)
    # The user's own parts register themselves, and the settings they declare
    # become fields, before the --config.X overrides are typed against them.
    # A command reading a run, or fine-tuning one (init_from), also knows the
    # parts that run registered, so that --config.model.projection=NAME
    # parses for a run of an extension.
    init_from = _flag_values(sys.argv, 'config.init_from') or [config.init_from]
    try:
      for run in map(os.path.expanduser, (self.run_to_read(sys.argv), init_from[-1])):
        # Local runs only: a gs:// one is read after its store is checked.
        if (
            run
            and not storage.is_object_store(run)
            and os.path.isfile(run_folder.RunFolder(run).config)
        ):
          import_extensions(run_builder.saved_config(run).extensions)
      import_command_extensions(config, sys.argv)
    except ConfigError as error:
      raise ConfigFileError(str(error)) from None
    config.lock()
    return config

  def run_to_read(self, argv: Sequence[str]) -> str:
    """The run folder a run-reading command is given in argv (its last
    --workdir), else ''."""
    workdirs = _flag_values(argv, 'workdir') if self.reads_run else []
    return workdirs[-1] if workdirs else ''

  def config_from_workdir(self, argv: Sequence[str]) -> str:
    """The run folder whose config.json stands for --config: that of a
    run-reading command given no --config in argv; else ''."""
    workdir = os.path.expanduser(self.run_to_read(argv))
    return workdir if workdir and not _flag_values(argv, 'config') else ''

  def _run_config(self, folder: str, flag: Optional[str]) -> ml_collections.ConfigDict:
    """The config a run saved in FOLDER/config.json, its extensions imported:
    for --config=FOLDER (`flag`), or in place of a --config not given (None)."""
    try:  # before gcsfs would retry for minutes
      storage.check_reachable(folder, flag.split('=')[0] if flag else '--workdir')
    except ConfigError as error:
      raise ConfigFileError(str(error)) from None
    try:
      config = run_builder.saved_config(folder)
      import_command_extensions(config, sys.argv)
    except ConfigError as error:
      if flag:
        raise ConfigFileError(f'{flag}: {error}') from None
      raise ConfigFileError(
          f'no --config was given, and {error} Or pass --config, a config file such as '
          'configs/default.py.'
      ) from None
    config.lock()
    return config


def _defining_config_flag(define: Callable[[], None]) -> None:
  """Runs `define` (ml_collections reads --flagfile files when --config is
  defined), reporting a flag file it cannot open in one line."""
  try:
    define()
  except flags.Error as error:
    fail(flag_error_words(error, sys.argv))


# The flags of the commands that name a file or folder (each command defines
# those it takes), checked with the config's path fields (`_check_paths`), and
# what to give instead of a URL where the path can only be local ('' where
# gs:// will do; a command may say otherwise: `local_path_flag`).
PATH_FLAGS = {
    'workdir': '',
    'out': 'results are written to a local folder: give a local --out',
    'from': 'a Hugging Face folder is read from this machine: download it here, or give a hub name',
    'sweep': 'a sweep file is read from this machine: copy it here',
    'books': 'the books are read from this machine: copy them here',
    'torch_python': 'give the path of a Python on this machine',
}


def define_config_flags(reads_run: bool = False, writes: bool = True) -> None:
  """Defines --config (a Python config file, overridable per field, or a run
  folder whose config.json is read) and --workdir.

  With `reads_run`, for commands that read a trained run, --config may be left
  out: the run's own WORKDIR/config.json is the config (its extensions
  imported), and --config.X overrides apply to it as to a file's; the --config
  flag records it (its `ConfigFileParser`), for the parsing of the flags and
  `run` to read. A command that writes nothing (not `writes`) needs no --workdir.
  """
  default_words = " (default: the run's own WORKDIR/config.json)" if reads_run else ''
  _defining_config_flag(
      lambda: config_flags.DEFINE_config_file(
          'config',
          None,
          'Config file, e.g. configs/default.py, or a run folder (its config.json)'
          f'{default_words}; any field can be overridden as --config.model.projected_len=64.',
          lock_config=True,
      )
  )
  flags.FLAGS['config'].parser = ConfigFileParser('config', reads_run=reads_run)
  flags.DEFINE_string(
      'workdir',
      None if writes else '',
      'Directory of the run: checkpoints, metrics, TensorBoard events, results.',
  )
  required = ([] if reads_run else ['config']) + (['workdir'] if writes else [])
  flags.mark_flags_as_required(required)
  flags.DEFINE_boolean(
      HELP_CONFIG,
      False,
      'Print every field of the config (file and --config.X overrides applied) with its '
      'value, help and bounds, and exit; --workdir may be left out.',
  )
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


def define_config_file_flag(default: str, help_text: str) -> None:
  """Defines --config alone, a config file loaded as ml_collections loads it,
  `default` unless given: for tools that run other commands with it."""
  _defining_config_flag(
      lambda: config_flags.DEFINE_config_file('config', default, help_text, lock_config=True)
  )


def start_processes() -> None:
  """Connects to the other processes of a multi-process run, if any, checks
  the backend against config.platform and prints it (process 0), before
  anything is written."""
  multihost.initialize(
      flags.FLAGS.coordinator_address,
      flags.FLAGS.num_processes,
      flags.FLAGS.process_id,
      flags.FLAGS.cpu_collectives,
  )
  multihost.check_platform(flags.FLAGS.config.platform)
  if jax.process_index() == 0:
    print(multihost.device_summary(), flush=True)


def run_settings(
    config: Optional[ml_collections.ConfigDict],
) -> Optional[run_config.RunConfig]:
  """A command's --config typed (on a copy), for advice that names the run's
  fields; None without one, or for one that is no whole run config."""
  if config is None:
    return None
  try:
    return run_config.RunConfig.from_config(copy.deepcopy(config))
  except (ValueError, TypeError, AttributeError):  # a field of the wrong kind; one missing
    return None


def fail(message: str) -> None:
  """Prints a one-line error and exits with the usage-error code."""
  print(f'error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  sys.exit(USAGE_ERROR_EXIT_CODE)


@contextlib.contextmanager
def saving_printed_results(where: str) -> Iterator[None]:
  """For the block that saves results the command has already printed: a
  file it cannot write (read-only, no permission, not a folder) ends the
  command in one line naming it and saying that the printed results were not
  saved. A full disk is reported by `run`."""
  try:
    yield
  except OSError as error:
    if is_disk_full(error):
      raise
    path = error.filename or where
    fail(
        f'the results printed above are not saved: {path} cannot be written '
        f'({error.strerror}); make it writable, or copy the run to a folder you can write to '
        'and run the same command there.'
    )


def save_printed_report(path: str, report: Any) -> None:
  """Writes a report the command has printed to `path` as JSON (under
  `saving_printed_results`) and says where."""
  with saving_printed_results(path):
    storage.write_text(path, json.dumps(report, indent=2, sort_keys=True))
  print(f'results in {path}', flush=True)


def _flag_values(argv: Sequence[str], name: str) -> List[str]:
  """The values argv (its flag files read) gives flag --NAME, in order."""
  try:
    arguments = flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False)
  except flags.Error:
    return []  # reported when the flags are parsed
  return flag_arguments(arguments, name)


def _config_file_parser() -> Optional[ConfigFileParser]:
  """The parser of the --config that `define_config_flags` defined, if the
  command called it: what it records of the command (`reads_run`)."""
  parser = flags.FLAGS['config'].parser if 'config' in flags.FLAGS else None
  return parser if isinstance(parser, ConfigFileParser) else None


def _command_reads_run() -> bool:
  """Whether the command reads the run in --workdir (`define_config_flags`)."""
  parser = _config_file_parser()
  return bool(parser and parser.reads_run)


def local_path_flag(name: str, instead: str) -> None:
  """Refuses a gs:// --NAME in one line saying `instead`, before the object
  store is checked: for a command that reads or writes --NAME as local files."""
  PATH_FLAGS[name] = instead


def _check_paths() -> None:
  """Makes `~` the home folder in the path flags (PATH_FLAGS) and the config's
  path fields (`run_config.expand_paths`), so that the run uses and saves the
  expanded paths, and refuses one that no library could use
  (`storage.check_paths`: not UTF-8, a URL where only a local path will do, an
  object store that cannot be reached), before anything reads or writes it."""
  paths = []
  for name in PATH_FLAGS:
    if name not in flags.FLAGS or not flags.FLAGS[name].value:
      continue
    value = flags.FLAGS[name].value
    values = [os.path.expanduser(path) for path in ([value] if isinstance(value, str) else value)]
    flags.FLAGS[name].value = values[0] if isinstance(value, str) else values
    paths += [(f'--{name}', path) for path in values]
  config = flags.FLAGS.config if 'config' in flags.FLAGS else None
  if config is not None:
    for setting, path in run_config.expand_paths(config):
      # Only a fresh run reads init_from: a run-reading command leaves it be.
      if not (_command_reads_run() and setting == 'config.init_from'):
        paths.append((setting, path))
  local = {f'--{name}': instead for name, instead in PATH_FLAGS.items() if instead}
  storage.check_paths(paths, {**run_config.LOCAL_PATHS, **local})


def _parse_flags(argv: List[str]) -> List[str]:
  # A run-reading command without --config reads the run's own config.
  parser = _config_file_parser()
  workdir = parser.config_from_workdir(argv) if parser else ''
  if workdir:
    argv = [argv[0], f'--config={workdir}', *argv[1:]]
  describing = f'--{HELP_CONFIG}' in argv and HELP_CONFIG in flags.FLAGS
  if describing and 'workdir' in flags.FLAGS and not flag_arguments(argv, 'workdir'):
    argv = [*argv, '--workdir=']  # listing the config writes nothing
  try:
    remaining = flags.FLAGS(argv)
    _check_paths()
    if describing:
      print('\n'.join(run_config.described(flags.FLAGS.config)))
      sys.exit(0)
    return remaining
  except (ConfigFileError, ConfigError) as error:
    fail(error)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as error:
    fail(flag_error_words(error, argv))


def run(main: Callable[[List[str]], None]) -> None:
  """Runs main like absl.app.run, with bad input reported as exit code 2.

  A stray positional argument is refused before `main` runs: every setting is a flag.
  """

  def guarded_main(argv):
    # Progress, evaluations and results are printed; library INFO logs (orbax
    # writes a dozen lines per checkpoint) only with --verbosity=0.
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
      takes_config = 'config' in flags.FLAGS
      form = '--config.FIELD=VALUE' if takes_config else '--FLAG=VALUE (see --help)'
      fail(f'unexpected arguments {argv[1:]}; pass settings as {form}')
    if _command_reads_run() and flags.FLAGS.config is None:
      fail(
          f'--workdir={flags.FLAGS.workdir!r} names no run folder, and no --config was given; '
          'point --workdir at a run that training wrote, or pass --config.'
      )
    try:
      if 'config' in flags.FLAGS and flags.FLAGS.config is not None:
        # Every path was checked as the flags were read (`_check_paths`).
        workdir = flags.FLAGS['workdir'].value if 'workdir' in flags.FLAGS else ''
        # Before anything compiles: JAX picks its cache folder at the first compile.
        compilation_cache.use_config_cache(flags.FLAGS.config, workdir or '')
        # The user's own parts register themselves before the config is checked.
        import_extensions(flags.FLAGS.config.extensions)
      main(argv)
    except ConfigError as error:
      fail(error)
    except (jax.errors.JaxRuntimeError, MemoryError) as error:
      # XLA's (or numpy's) out-of-memory wherever it comes: restoring a
      # checkpoint, evaluating, generating, a step running out mid-run.
      config = flags.FLAGS.config if 'config' in flags.FLAGS else None
      message = memory_budget.out_of_memory_message(error, run_settings(config))
      if message is None:
        raise
      fail(message)
    except OSError as error:
      where = error.filename or (flags.FLAGS['workdir'].value if 'workdir' in flags.FLAGS else '')
      where = where or os.getcwd()
      if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fail(
            f'cannot write {where}: the disk is full ({free_space_of(where)}). Free space or '
            'move the workdir to a larger disk, then run the same command to resume.'
        )
      if error.errno not in _PATH_ERRNOS:
        raise
      fail(
          f'{where} cannot be used ({error.strerror}); fix the path or its permissions, or '
          'give another one, then run the same command again.'
      )

  # A command run other than by `python -m linformer_jax.NAME` is set up
  # here, still before JAX starts a backend (command_process). Ctrl-C or
  # SIGTERM outside a training loop (which saves and exits 130 or 143 itself),
  # or in a command that only reads: nothing half-written is kept, and the
  # process ends in one line without shutting the interpreter down under
  # XLA's threads (interrupts).
  command_process.prepare()
  with interrupts.raising():
    try:
      app.run(guarded_main, flags_parser=_parse_flags)
    except KeyboardInterrupt as error:
      interrupts.exit_for(getattr(error, 'signum', signal.SIGINT))
    except SystemExit as error:
      if error.code not in (0, None):
        # Its line is printed: a library thread that never ends (orbax's,
        # after a background save failed) must not keep the process alive.
        interrupts.exit_within(
            EXIT_DEADLINE_SECONDS, error.code if isinstance(error.code, int) else 1
        )
      raise
