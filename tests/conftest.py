"""Fixtures shared by the test suite: the repository root, a runner for the
command-line programs, and a data cache that is never the user's.

The data cache: the library reads its cache folder from config.data.cache_dir,
else $LINFORMER_JAX_CACHE_DIR, else ~/.cache/linformer_jax. For the whole
session the variable points at one fresh temporary folder, so the tests never
read or write the user's cache, and the embedded corpus is still extracted and
tokenized once per session. Programs started by the tests inherit it.

The compilation cache: most tests compile the same small programs (the tiny
config's train and eval steps, in-process and in the commands they start).
For the whole session JAX's persistent compilation cache lives in one fresh
temporary folder, named by the JAX_* variables below so that programs started
by the tests share it: each program is compiled once per session.

The tiny run: three test files start from a finished run of configs/tiny.py.
It is trained once per session, by whichever worker asks first (the others
wait on a file lock), and each module gets its own copy to write into.

End-to-end tests are marked `slow` (see pytest.ini): those sharing a run
through a fixture by END_TO_END_FIXTURES below, the cases of a check
repeated over many variants beyond the FAST_CASES representatives, and the
longest ones, marked `long` where they are defined. `pytest -m "not slow"`
is the fast loop, `pytest -m "not long"` (`make test`) the suite under 10
minutes on 2 cores, plain `pytest` (`make test-all`) runs everything.
"""

import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Optional, Union

import jax
import pytest

from linformer_jax import xla_cpu
from linformer_jax.data import cache

# The tests compile as the entry points do (see linformer_jax.xla_cpu), but
# with LLVM's optimisation level 0: XLA's HLO passes (fusion, layout, buffer
# assignment, so the memory analyses) are the same, and most of this suite's
# time is compiling tiny programs, a third less at level 0. Results differ
# from the default build only in float32 rounding: configs/tiny.py's losses
# differ in the last bit at some steps. Programs the tests start inherit it.
# An XLA_FLAGS that sets the level itself is kept.
OPTIMISATION_LEVEL_FLAG = '--xla_backend_optimization_level'
if OPTIMISATION_LEVEL_FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {OPTIMISATION_LEVEL_FLAG}=0".strip()
xla_cpu.disable_library_fusions()

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
# The compilation cache's settings, as JAX reads them from the environment:
# the folder (set per session below), and every program cached however fast
# it compiled and however small it is.
CACHE_FOLDER_VARIABLE = 'JAX_COMPILATION_CACHE_DIR'
# The session's folder, set once by the process that runs pytest; and the
# variable pytest-xdist sets in each of its workers.
SESSION_CACHE_VARIABLE = 'LINFORMER_JAX_TEST_COMPILATION_CACHE'
XDIST_WORKER_VARIABLE = 'PYTEST_XDIST_WORKER'
# The session's folder of runs trained once for every worker (the tiny run).
SHARED_RUNS_VARIABLE = 'LINFORMER_JAX_TEST_SHARED_RUNS'
CACHE_EVERY_PROGRAM = {
    'jax_persistent_cache_min_compile_time_secs': 0,
    'jax_persistent_cache_min_entry_size_bytes': 0,
}


def pytest_configure(config):
  """Points JAX's compilation cache at a fresh folder before any test module
  is imported (JAX decides once per process, at its first compilation,
  whether a cache is used). The programs the tests start inherit it, and so
  do the workers of `pytest -n`, which start after this ran in the
  controlling process."""
  del config
  folder = os.environ.get(SESSION_CACHE_VARIABLE)
  if not folder:
    folder = tempfile.mkdtemp(prefix='linformer_jax_compilation_cache_')
    os.environ[SESSION_CACHE_VARIABLE] = folder
    os.environ[SHARED_RUNS_VARIABLE] = tempfile.mkdtemp(prefix='linformer_jax_test_runs_')
  os.environ[CACHE_FOLDER_VARIABLE] = folder
  for name, value in CACHE_EVERY_PROGRAM.items():
    os.environ[name.upper()] = str(value)
    jax.config.update(name, value)
  jax.config.update(CACHE_FOLDER_VARIABLE.lower(), folder)


# The files that take longest, run first: with one file per worker at a time
# (`make test`), a long file started last would leave the other cores idle.
# Ordered by their time in `make test` (`pytest -m "not long" --durations=0`,
# 2 cores, 15 to 73 s each); the other files take under 20 s.
LONGEST_FILES_FIRST = (
    'test_hf_export.py',
    'test_rival_kinds_blocked.py',
    'test_extending_walkthrough.py',
    'test_models.py',
    'test_divergence.py',
    'test_xla_targets.py',  # last alphabetically: left unranked it ends the run alone
    'test_rival_kinds.py',
    'test_causal_attention.py',
    'test_rival_kinds_nystrom_reformer.py',
    'test_train.py',
    'test_api.py',
    'test_attention_kernels.py',
    'test_command_inputs.py',
    'test_remat_and_scan.py',
    'test_generation.py',
    'test_classification.py',
    'test_damaged_run_files.py',
    'test_rival_kinds_scale.py',
    'test_benchmark.py',
    'test_unsound_runs.py',
    'test_launch_commands.py',
    'test_interrupts.py',
    'test_rival_benchmark.py',
    'test_reliability.py',
)


# Fixtures that run a training or a benchmark once for their module's tests,
# by file: every test using one is `slow` (an end-to-end run; see pytest.ini).
END_TO_END_FIXTURES = {
    'test_benchmark.py': ('grid', 'efficient_grid', 'budget_grid'),
    'test_causal_benchmark.py': ('run',),
    'test_classification.py': ('pretrained',),
    'test_divergence.py': ('diverged_run',),
    'test_generation.py': ('causal_run',),
    'test_hf_export.py': ('exported',),
    'test_pooling_probe.py': ('pretrained',),
    'test_sweep.py': ('finished_sweep',),
    'test_tokenizer_safety.py': ('stopped_run',),
    'test_train.py': ('finished_run',),
}


# Checks repeated over many variants: `make test` and the fast loop run these
# representatives (a Linformer and a Transformer, a learned and a fixed
# projection); the other cases are `long` (`make test-all` runs them).
FAST_CASES = {
    'test_padding_never_enters_the_output_for_any_init': ('jl-0.0-none', 'local-0.0-layerwise'),
    'test_build_datasets_names_the_bad_field': (
        'data.source-web',
        'data.tokenizer-bpe',
        'model.max_len-2',
        'data.worker_count--1',
    ),
    'test_query_blocks_per_step_matches_all_at_once': ('max',),
    # One bad input per command (tests/command_input_cases.py), and the checks
    # that need an object store or a read-only mount.
    'test_bad_input_is_one_line_exit_2_and_changes_nothing': (
        'evaluate/restore_step not kept',
        'evaluate/no config, a workdir without a run',
        'evaluate/read-only workdir',
        'evaluate/gs without credentials',
        'generate/temperature nan',
        'spectrum/out is a file',
        'projection_stats/step negative',
        'sweep/unknown variant',
        'import_checkpoint/from a missing folder',
        'prepare_data/workdir is a file',
        'benchmark/unexpected argument',
        # A path: `~` expanded, a name that is not UTF-8, gs:// without network.
        'train/~ in cache_dir',
        'train/workdir not UTF-8',
        'train/gs init_from without network',
    ),
    'test_model_output_is_padding_invariant': ('full-linear-False', 'linformer-mean-False'),
    'test_every_learned_projection_gets_a_nonzero_gradient': ('linear-none', 'conv-layerwise'),
    'test_every_pooling_is_padding_invariant': ('mean-linformer', 'attention-full'),
    'test_changing_later_tokens_changes_no_earlier_logit': ('linear-none', 'transformer'),
    'test_chunked_inference_gives_the_same_logits_with_padding': ('full', 'none'),
    'test_decoding_with_the_cache_gives_the_full_forward_logits': ('linear-none', 'max-layerwise'),
    'test_model_output_with_an_example_is_padding_invariant': (
        'tempered_linformer-linear-headwise',
        'tempered_linformer-convex-layerwise',
    ),
    'test_the_report_has_probes_and_attention_per_layer': ('linformer',),
    'test_the_pallas_tpu_kernel_matches_float64_in_interpret_mode': (
        'linformer',
        'transformer-padded',
    ),
    # Both signals go through one handler; SIGTERM (a preemption) represents them.
    'test_sigterm_and_ctrl_c_save_a_checkpoint_before_exiting': ('sigterm',),
    'test_every_command_with_a_config_file_reports_it_in_one_line': (
        'train-raises_on_import',
        'evaluate-syntax_error',
        'mesh_memory-no_get_config',
    ),
}


def pytest_collection_modifyitems(config, items):
  del config
  cases_seen = {}
  for item in items:
    end_to_end = set(END_TO_END_FIXTURES.get(item.path.name, ())) & set(item.fixturenames)
    fast_cases = FAST_CASES.get(getattr(item, 'originalname', ''))
    another_case = fast_cases is not None and item.callspec.id not in fast_cases
    if fast_cases is not None:
      cases_seen.setdefault(item.originalname, set()).add(item.callspec.id)
    if another_case:
      item.add_marker(pytest.mark.long)
    if end_to_end or another_case or item.get_closest_marker('long'):
      item.add_marker(pytest.mark.slow)
  for name, seen in cases_seen.items():
    # (Fewer cases than representatives: a selection of single cases.)
    if len(seen) > len(FAST_CASES[name]) and not set(FAST_CASES[name]) <= seen:
      raise pytest.UsageError(
          f'tests/conftest.py FAST_CASES names cases of {name} that no longer exist: '
          f'{sorted(set(FAST_CASES[name]) - seen)}; name some of {sorted(seen)}.'
      )
  rank = {name: index for index, name in enumerate(LONGEST_FILES_FIRST)}
  # A stable sort: the order within each file is kept.
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config):
  del config
  if XDIST_WORKER_VARIABLE not in os.environ:  # the folder is the controlling process's
    for variable in (SESSION_CACHE_VARIABLE, SHARED_RUNS_VARIABLE):
      shutil.rmtree(os.environ.pop(variable, ''), ignore_errors=True)


@pytest.fixture(scope='session', autouse=True)
def data_cache(tmp_path_factory) -> pathlib.Path:
  """The session's data cache, named by $LINFORMER_JAX_CACHE_DIR."""
  folder = tmp_path_factory.mktemp('data_cache')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(cache.CACHE_DIR_VARIABLE, str(folder))
    yield folder


@pytest.fixture(scope='session')
def repo_root() -> pathlib.Path:
  """The repository root (holds configs/, experiments/ and linformer_jax/)."""
  return REPO_ROOT


def _start_python(
    *arguments: str, wait: bool, timeout: float, log: Optional[Union[str, os.PathLike]]
):
  """Runs `python ARGUMENTS` in the repository root, on CPU.

  With `wait`, returns the finished `subprocess.CompletedProcess`, its stdout
  and stderr captured as text (killed after `timeout` seconds). Without, returns
  the running `subprocess.Popen`, its stderr merged into stdout: a text pipe,
  or the file `log` where given (a pipe nobody reads can fill and stall it).
  """
  command = [sys.executable, *arguments]
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT), 'JAX_PLATFORMS': 'cpu'}
  if wait:
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
  if log is None:
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
  with open(log, 'w') as output:
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope='session')
def run_python():
  """`run_python(script, *args, wait=True, timeout=300, log=None)` runs a Python
  script in the repository root on CPU; see `_start_python`."""

  def run(script, *args, wait=True, timeout=300, log=None):
    return _start_python(str(script), *map(str, args), wait=wait, timeout=timeout, log=log)

  return run


@pytest.fixture(scope='session')
def run_command():
  """`run_command(module, *args, wait=True, timeout=300)` runs
  `python -m linformer_jax.MODULE ARGS` in the repository root on CPU, as a user
  would; see `_start_python`. Relative paths (configs/tiny.py) are from the root.
  """

  def run(module, *args, wait=True, timeout=300):
    return _start_python(
        '-m', f'linformer_jax.{module}', *map(str, args), wait=wait, timeout=timeout, log=None
    )

  return run


@pytest.fixture
def books(tmp_path) -> pathlib.Path:
  """A folder of three small Gutenberg-style 'books' (CRLF newlines, header and
  licence markers) whose paragraphs name their book, and one non-.txt file."""
  folder = tmp_path / 'books'
  folder.mkdir(parents=True, exist_ok=True)
  for name in ('a', 'b', 'c'):
    paragraphs = [f'Book {name} paragraph {i} ' + 'word ' * 60 for i in range(80)]
    text = (
        'Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n'
        + '\n\n'.join(p.replace('word word ', 'word\nword ', 3) for p in paragraphs)
        + '\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicence\n'
    )
    (folder / f'{name}.txt').write_bytes(text.replace('\n', '\r\n').encode())
  (folder / 'notes.md').write_text('not a .txt file')
  return folder


@pytest.fixture(scope='session')
def gcs_bucket() -> str:
  """'gs://BUCKET' of a GCS emulator on the loopback address (tests/gcs_emulator.py)."""
  import gcs_emulator  # pylint: disable=g-import-not-at-top

  with gcs_emulator.started() as bucket:
    yield bucket


@pytest.fixture(scope='session')
def _session_tiny_run():
  """(workdir, results) of configs/tiny.py trained once per session: the
  first worker to ask trains it under a file lock, the others wait and read.
  Tests take copies (`tiny_run`), never this folder."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from linformer_jax.training import trainer  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(os.environ[SHARED_RUNS_VARIABLE])
  workdir, results_file = root / 'tiny', root / 'tiny_results.json'
  with open(root / 'tiny.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      if not results_file.exists():
        shutil.rmtree(workdir, ignore_errors=True)  # left by a worker that failed midway
        results = trainer.train_and_evaluate(tiny.get_config(), str(workdir))
        results_file.write_text(json.dumps(results))
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  return workdir, json.loads(results_file.read_text())


@pytest.fixture(scope='module')
def tiny_run(_session_tiny_run, tmp_path_factory):
  """(workdir, results) of a finished run of configs/tiny.py (20 steps), the
  module's own copy of the session's run."""
  workdir, results = _session_tiny_run
  copy = tmp_path_factory.mktemp('tiny_run') / 'run'
  shutil.copytree(workdir, copy)
  return str(copy), results


@pytest.fixture
def run_copy(tiny_run, tmp_path):
  """A copy of the finished tiny run for one test to change: steps 10 and 20,
  sealed, and its ledger."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(tiny_run[0], workdir)
  return workdir
