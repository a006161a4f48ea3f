"""MetricLogger: JSON lines, TensorBoard event files and progress lines.

Event files are read back with TensorBoard's own reader; progress rates and
ETAs run on a fake clock and are compared with values worked out by hand.
"""

import os
import pathlib
import time

import jax.numpy as jnp
import numpy as np
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util

from linformer_jax import run_folder
from linformer_jax.training.metric_writers import MetricLogger
from linformer_jax.training.metric_writers import read_metrics


def test_scalars_round_trip_through_metrics_jsonl(tmp_path):
  workdir = str(tmp_path)
  logger = MetricLogger(workdir, total_steps=10)
  logger.write_scalars(1, {'train_loss': jnp.float32(2.5), 'accuracy': np.float64(0.25)})
  logger.write_scalars(2, {'train_loss': 1.75, 'tokens': jnp.asarray(3, jnp.int32)})
  logger.close()
  assert read_metrics(workdir) == [
      {'step': 1, 'train_loss': 2.5, 'accuracy': 0.25},
      {'step': 2, 'train_loss': 1.75, 'tokens': 3.0},
  ]


def test_reading_skips_a_record_still_being_written(tmp_path):
  pathlib.Path(run_folder.RunFolder(str(tmp_path)).metrics).write_text(
      '{"step": 1, "loss": 2.0}\n{"step": 2, "lo'
  )
  assert read_metrics(str(tmp_path)) == [{'step': 1, 'loss': 2.0}]
  assert read_metrics(str(tmp_path / 'no_run_here')) == []


def test_tensorboard_event_file_is_written(tmp_path):
  workdir = str(tmp_path)
  logger = MetricLogger(workdir, total_steps=10)
  logger.write_scalars(3, {'eval_loss': 4.0})
  logger.write_scalars(5, {'eval_loss': 2.5, 'eval_accuracy': 0.75})
  logger.close()
  (events,) = [name for name in os.listdir(workdir) if name.startswith('events.out.tfevents')]
  scalars = [
      (event.step, value.tag, float(tensor_util.make_ndarray(value.tensor)))
      for event in event_file_loader.EventFileLoader(os.path.join(workdir, events)).Load()
      for value in event.summary.value
  ]
  assert sorted(scalars) == [
      (3, 'eval_loss', 4.0),
      (5, 'eval_accuracy', 0.75),
      (5, 'eval_loss', 2.5),
  ]


def test_loggers_opened_in_the_same_second_write_files_of_their_own(tmp_path):
  workdir = str(tmp_path)
  for step in (1, 2):
    logger = MetricLogger(workdir, total_steps=2)
    logger.write_scalars(step, {'train_loss': float(step)})
    logger.close()
  files = [name for name in os.listdir(workdir) if name.startswith('events.out.tfevents')]
  steps = [
      event.step
      for name in files
      for event in event_file_loader.EventFileLoader(os.path.join(workdir, name)).Load()
      if event.summary.value
  ]
  assert len(files) == 2 and sorted(steps) == [1, 2]


def test_writing_metrics_never_imports_tensorflow(tmp_path, run_python):
  """TensorFlow's import takes seconds, in every command that trains."""
  code = f"""
import sys
from linformer_jax.training import trainer
from linformer_jax.training.metric_writers import MetricLogger
logger = MetricLogger({str(tmp_path)!r}, total_steps=1)
logger.write_scalars(1, {{'train_loss': 1.0}})
logger.close()
assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'
"""
  result = run_python('-c', code)
  assert result.returncode == 0, result.stderr


def test_non_primary_processes_write_no_files(tmp_path):
  workdir = str(tmp_path / 'run')
  logger = MetricLogger(workdir, total_steps=10, is_primary=False)
  logger.write_scalars(1, {'train_loss': 1.0})
  logger.discard_after(0)
  logger.close()
  assert not os.path.exists(workdir)


def test_discard_after_drops_the_records_of_later_steps(tmp_path):
  workdir = str(tmp_path)
  logger = MetricLogger(workdir, total_steps=10)
  for step in range(1, 6):
    logger.write_scalars(step, {'train_loss': float(step)})
  logger.discard_after(3)
  logger.write_scalars(4, {'train_loss': 40.0})
  logger.close()
  assert [(m['step'], m['train_loss']) for m in read_metrics(workdir)] == [
      (1, 1.0),
      (2, 2.0),
      (3, 3.0),
      (4, 40.0),
  ]


def test_progress_prints_a_line_with_rates_and_eta(tmp_path, capsys, monkeypatch):
  logger = MetricLogger(str(tmp_path), total_steps=1000)
  now = [100.0]
  monkeypatch.setattr(time, 'monotonic', lambda: now[0])
  logger.discard_after(0)  # counts from step 0 at t = 100 s
  now[0] = 110.0
  rates = logger.progress(120, tokens_per_step=256, loss=5.1234)
  now[0] = 130.0
  later = logger.progress(240, tokens_per_step=256)
  now[0] = 5530.0
  slow = logger.progress(250, tokens_per_step=256)
  logger.close()
  # 120 steps in 10 s; then 120 steps in 20 s; then 10 steps in 5400 s.
  assert rates == {'steps_per_sec': 12.0, 'tokens_per_sec': 3072.0}
  assert later == {'steps_per_sec': 6.0, 'tokens_per_sec': 1536.0}
  assert slow['steps_per_sec'] == 10 / 5400
  # ETAs: 880 steps at 12/s is 73 s; 760 at 6/s 127 s; 750 at 1/540 s 112.5 h.
  assert capsys.readouterr().out.splitlines() == [
      'step 120/1000 | loss 5.123 | 12 steps/s | 3,072 tokens/s | ETA 1m13s',
      'step 240/1000 | 6 steps/s | 1,536 tokens/s | ETA 2m07s',
      'step 250/1000 | 0.00185 steps/s | 0 tokens/s | ETA 112h30m',
  ]


def test_excluded_time_and_flops_give_the_rates_and_mfu(tmp_path, capsys, monkeypatch):
  logger = MetricLogger(str(tmp_path), total_steps=100)
  now = [0.0]
  monkeypatch.setattr(time, 'monotonic', lambda: now[0])
  logger.discard_after(0)
  now[0] = 30.0
  logger.exclude(20.0)  # an evaluation: 10 steps in the 10 s left
  rates = logger.progress(10, tokens_per_step=100, flops_per_step=4e12, peak_flops=8e12)
  now[0] = 32.0
  no_peak = logger.progress(12, tokens_per_step=100, flops_per_step=4e12)
  logger.close()
  assert rates == {
      'steps_per_sec': 1.0,
      'tokens_per_sec': 100.0,
      'tflops_per_device': 4.0,
      'mfu': 0.5,
  }
  assert no_peak == {'steps_per_sec': 1.0, 'tokens_per_sec': 100.0, 'tflops_per_device': 4.0}
  first, second = capsys.readouterr().out.splitlines()
  assert '4 TFLOP/s per device | MFU 50.0% |' in first
  assert 'MFU' not in second
