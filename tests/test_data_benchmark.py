"""The data-pipeline benchmark: corpus, settings, tree RSS, loader rate, report.

In-process tests use a few made-up documents; the `slow` tests start processes
and run `python -m linformer_jax.data_benchmark` on a 1 MiB corpus with the byte
tokenizer.
"""

import json
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from configs import tiny
from linformer_jax import data_benchmark
from linformer_jax.analysis import data_benchmark_corpus
from linformer_jax.analysis import data_benchmark_report
from linformer_jax.analysis import loader_throughput
from linformer_jax.analysis import process_memory
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError

TRAIN = [
    f'Document {i}. ' + 'The quick brown fox jumps over the lazy dog. ' * (20 + i)
    for i in range(40)
]
VALIDATION = ['A validation document about foxes and dogs. ' * 10]
MIB = 2**20


def settings(tmp_path, **overrides):
  values = dict(
      out=str(tmp_path), sizes_mb=[1], config_path='configs/tiny.py', config=tiny.get_config()
  )
  return data_benchmark.Settings(**{**values, **overrides})


def test_the_corpus_is_whole_documents_about_the_size_different_per_file_and_reused(tmp_path):
  folder = tmp_path / 'corpus'
  manifest = data_benchmark_corpus.generate_corpus(folder, 2, seed=0, documents=(TRAIN, VALIDATION))
  files = sorted(folder.glob('train-*.txt'))
  assert len(files) == manifest['train_files'] == 2
  longest = max(len(text) for text in TRAIN)
  assert 2 * MIB <= manifest['train_bytes'] <= 2 * MIB + 2 * (longest + 3)
  assert manifest['train_bytes'] == sum(path.stat().st_size for path in files)
  texts = [path.read_text() for path in files]
  assert set(texts[0].rstrip('\n').split('\n\n')) == set(TRAIN)  # every document, none cut
  assert texts[0] != texts[1]
  assert (folder / 'validation.txt').read_text() == VALIDATION[0] + '\n'
  stamps = [path.stat().st_mtime_ns for path in files]
  again = data_benchmark_corpus.generate_corpus(folder, 2, seed=0, documents=([], []))
  assert again == manifest and [path.stat().st_mtime_ns for path in files] == stamps
  data_benchmark_corpus.generate_corpus(folder, 2, seed=1, documents=(TRAIN, VALIDATION))
  assert files[0].read_text() != texts[0]


def test_overrides_become_flags_the_config_parser_reads_back(tmp_path):
  overrides = data_benchmark_corpus.corpus_overrides(str(tmp_path), 64)
  flags = data_benchmark_report.config_arguments('configs/tiny.py', overrides)
  assert flags[:2] == ['--config', 'configs/tiny.py']
  assert "--config.data.split_files={'validation': ['validation.txt']}" in flags
  assert f'--config.data.path={tmp_path}' in flags
  config = data_benchmark.apply_overrides(tiny.get_config(), overrides)
  assert config.model.max_len == 64 and list(config.data.split_files.validation) == [
      'validation.txt'
  ]
  assert tiny.get_config().model.max_len == 32


@pytest.mark.parametrize(
    'overrides, flag',
    [
        (dict(sizes_mb=[0]), '--sizes_mb'),
        (dict(stages=['prepare', 'bogus']), '--stages'),
        (dict(seq_len=2), '--seq_len'),
        (dict(seq_len=4), 'projected_len'),  # tiny's k=8 does not fit n=4
        (dict(loader_seconds=0), '--loader_seconds'),
    ],
)
def test_bad_settings_name_what_to_change(tmp_path, overrides, flag):
  with pytest.raises(ConfigError, match=flag):
    settings(tmp_path, **overrides)


def test_the_loader_rate_counts_masked_batches_and_their_cpu_time_per_core(tmp_path):
  sequences = np.random.default_rng(0).integers(4, 260, (64, 16), np.int32)
  rates = loader_throughput.loader_throughput(
      sequences, tokenizer_lib.ByteTokenizer(), batch_size=8, seconds=0.2, warmup_batches=2
  )
  assert rates['batches'] >= 1 and rates['seconds'] >= 0.2
  assert rates['sequences_per_s'] == pytest.approx(rates['batches'] * 8 / rates['seconds'])
  assert rates['tokens_per_s'] == pytest.approx(16 * rates['sequences_per_s'])
  # One process, no workers: at most one core (and a little for the clocks).
  assert 0 < rates['cpu_seconds'] <= rates['seconds'] * 1.1
  assert rates['cores_used'] == pytest.approx(rates['cpu_seconds'] / rates['seconds'])
  assert rates['tokens_per_core_s'] == pytest.approx(
      rates['batches'] * 8 * 16 / rates['cpu_seconds']
  )


def test_the_cpu_time_of_a_process_tree_counts_its_children():
  # The child spins past the 0.4 s the test waits for: /proc counts CPU time in
  # clock ticks, which may round a spin of exactly 0.4 s down to 0.39.
  busy = 'import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass'
  child = subprocess.Popen([sys.executable, '-c', busy + '\ntime.sleep(30)'])
  try:
    process, deadline = psutil.Process(), time.monotonic() + 20
    while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.4:
      assert time.monotonic() < deadline
      time.sleep(0.05)
    own = sum(process.cpu_times()[:2])
    assert loader_throughput.tree_cpu_seconds(process) >= own + 0.4
  finally:
    child.kill()
    child.wait()


def test_loader_settings_parse_and_repeats_summarize_as_best_and_median(tmp_path):
  setting = loader_throughput.LoaderSetting.parse('2:1:4')
  assert (setting.worker_count, setting.read_threads, setting.prefetch_buffer) == (2, 1, 4)
  assert setting.label == '2:1:4'
  runs = [
      {
          'sequences_per_s': rate / 16,
          'tokens_per_s': rate,
          'tokens_per_core_s': rate / cores,
          'cores_used': cores,
      }
      for rate, cores in ((3e6, 1.5), (5e6, 2.0), (4e6, 1.0))
  ]
  summary = loader_throughput.summarize(setting, runs)
  assert summary['best_tokens_per_s'] == 5e6 and summary['median_tokens_per_s'] == 4e6
  assert summary['best_tokens_per_core_s'] == 4e6 and summary['median_cores_used'] == 1.5
  assert summary['worker_count'] == 2 and summary['runs'] == runs
  for text in ('2:1', 'a:0:0', '-1:0:0'):
    with pytest.raises(ConfigError, match='--loader_settings'):
      settings(tmp_path, loader_settings=[text])
  assert settings(tmp_path).describe()['loader_settings'] == []


def test_results_merge_by_size_and_the_table_has_a_column_per_size(tmp_path):
  described = settings(tmp_path).describe()
  machine = data_benchmark_report.machine_description()
  first = data_benchmark_report.merge_results(
      None, described, machine, {'1024': {'loader': {'sequences_per_s': 1000.0}}}
  )
  both = data_benchmark_report.merge_results(
      first, described, machine, {'256': {'prepare': {'speed_up': 1.5}}}
  )
  assert sorted(both['sizes']) == ['1024', '256']
  other = settings(tmp_path, seq_len=64).describe()
  assert list(data_benchmark_report.merge_results(both, other, machine, {'1': {}})['sizes']) == [
      '1'
  ]
  table = data_benchmark_report.markdown_table(both)
  assert f'{machine["cpus"]} CPUs' in table.splitlines()[0]
  assert '| measure | 256 MB | 1024 MB |' in table
  assert '| prepare speed-up, all cores / 1 worker | 1.50x | – |' in table
  assert '| loader: masked sequences/s | – | 1,000 |' in table


def test_the_table_reports_tokens_per_core_and_each_loader_setting(tmp_path):
  runs = [
      {'sequences_per_s': 1e4, 'tokens_per_s': 5.12e6, 'tokens_per_core_s': 4e6, 'cores_used': 1.28}
  ]
  summaries = {
      setting.label: loader_throughput.summarize(setting, runs)
      for setting in (loader_throughput.LoaderSetting(), loader_throughput.LoaderSetting(2, 0, 0))
  }
  loader = {
      'sequences_per_s': 1e4,
      'tokens_per_s': 5.12e6,
      'tokens_per_core_s': 4e6,
      'cores_used': 1.28,
      'settings': summaries,
  }
  results = data_benchmark_report.merge_results(
      None,
      settings(tmp_path).describe(),
      data_benchmark_report.machine_description(),
      {'64': {'loader': loader}},
  )
  table = data_benchmark_report.markdown_table(results)
  assert '| loader: tokens/s per core | 4,000,000 |' in table
  assert '| loader: cores used | 1.28 |' in table
  assert (
      '| loader, 2 workers, 0 read threads, prefetch 0: M tokens/s, best / median | 5.12 / 5.12 |'
      in table
  )
  assert (
      '| loader, 0 workers, 0 read threads, prefetch 0: M tokens/s per core, best / median '
      '| 4.00 / 4.00 |'
  ) in table
  assert 'CPU seconds' in table.splitlines()[0]


@pytest.mark.slow
def test_peak_tree_rss_counts_the_children():
  child = 'import time, numpy; a = numpy.ones(2**27, numpy.uint8); time.sleep(1)'
  parent = f'import subprocess, sys; subprocess.run([sys.executable, "-c", {child!r}])'
  popen = subprocess.Popen([sys.executable, '-c', parent])
  assert process_memory.peak_tree_rss(popen) > 2**27
  assert popen.returncode == 0


@pytest.mark.long
@pytest.mark.slow
def test_the_command_measures_every_stage_and_merges_runs(tmp_path, run_command):
  common = [
      '--out',
      tmp_path,
      '--sizes_mb=1',
      '--config',
      'configs/tiny.py',
      '--loader_seconds=0.5',
  ]
  first = run_command('data_benchmark', *common, '--stages=prepare,loader', timeout=600)
  assert first.returncode == 0, first.stderr
  second = run_command('data_benchmark', *common, '--stages=train', timeout=600)
  assert second.returncode == 0, second.stderr
  results = json.loads((tmp_path / 'data_benchmark.json').read_text())
  entry = results['sizes']['1']
  assert (
      entry['prepare']['workers1']['train_tokens']
      == entry['prepare']['workers_all']['train_tokens']
  )
  assert entry['prepare']['workers_all']['peak_rss_gib'] > 0
  assert entry['loader']['sequences_per_s'] > 0
  assert 0 < entry['train']['resumed']['first_step_s'] < entry['train']['resumed']['wall_s']
  table = (tmp_path / 'data_benchmark.md').read_text()
  assert table in second.stdout and '–' not in table.split('\n', 1)[1]


@pytest.mark.slow
# A flag that does not parse, and one the settings refuse (the others are
# checked in-process by test_bad_settings_name_what_to_change).
@pytest.mark.parametrize('flag', ['--sizes_mb=a', '--stages=bogus'])
def test_bad_flags_end_with_one_line_and_exit_code_2(tmp_path, run_command, flag):
  result = run_command('data_benchmark', '--out', tmp_path, '--config', 'configs/tiny.py', flag)
  assert result.returncode == 2
  assert result.stderr.strip().count('\n') == 0 and result.stderr.startswith('error:')
