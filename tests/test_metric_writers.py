"""MetricLogger: JSON lines, TensorBoard event files and progress lines."""

import os
import time

import jax.numpy as jnp
import numpy as np

from linformer_jax.training.metric_writers import METRICS_FILE, MetricLogger, read_metrics


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
  (tmp_path / METRICS_FILE).write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
  assert read_metrics(str(tmp_path)) == [{'step': 1, 'loss': 2.0}]
  assert read_metrics(str(tmp_path / 'no_run_here')) == []


def test_tensorboard_event_file_is_written(tmp_path):
  workdir = str(tmp_path)
  logger = MetricLogger(workdir, total_steps=10)
  logger.write_scalars(3, {'eval_loss': 4.0})
  logger.close()
  events = [name for name in os.listdir(workdir) if name.startswith('events.out.tfevents')]
  assert events and os.path.getsize(os.path.join(workdir, events[0])) > 0


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
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_progress_prints_a_line_with_rates_and_eta(tmp_path, capsys):
  logger = MetricLogger(str(tmp_path), total_steps=1000)
  time.sleep(0.01)
  rates = logger.progress(120, tokens_per_step=256, loss=5.1234)
  time.sleep(0.01)
  later = logger.progress(240, tokens_per_step=256)
  logger.close()
  assert rates['steps_per_sec'] > 0 and later['steps_per_sec'] > 0
  assert rates['tokens_per_sec'] == rates['steps_per_sec'] * 256
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2
  assert lines[0].startswith('step 120/1000 | loss 5.123 | ')
  assert 'tokens/s' in lines[0] and 'ETA ' in lines[0]
  assert lines[1].startswith('step 240/1000 | ') and 'ETA ' in lines[1]
