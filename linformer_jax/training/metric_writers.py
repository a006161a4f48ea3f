"""Training metrics: TensorBoard event files, a JSON-lines file and progress.

This is the project's only module that writes metrics. `MetricLogger` logs
every scalar (absl), writes it to a TensorBoard event file in the workdir
(`EventFile`) and appends it to `WORKDIR/metrics.jsonl`, one JSON object per
line: `{"step": 120, "train_loss": 5.1, ...}`. `read_metrics` reads that file
back, for tests, notebooks and plotting tools that should not need TensorBoard.
JSON has no NaN or infinity: such a value (a skipped step's loss, a perplexity
too large to mean anything) is written null (`json_text`, which the results
files use too) and read back as NaN.

Event files are written with TensorBoard's own TF-free pieces, its protocol
buffers and its `RecordWriter` (the TFRecord framing): TensorFlow's summary
writer (clu's default writer uses it) costs seconds of import in every run for
a few scalars, and TensorBoard's `EventFileWriter` goes through `tf.io.gfile`
and writes from a thread on a timer, where a run must find its scalars on disk
after every step.

Only the primary process (process 0) writes files; the others only log.

The progress line (`MetricLogger.progress`) is timed here, not by clu's
`periodic_actions.ReportProgress`: that one reports steps/s and an ETA to a
clu metric writer and to absl's INFO log, which the commands keep quiet, and
knows nothing of the tokens/s, TFLOP/s and MFU the line prints. Profiling
uses clu's `periodic_actions.Profile` (training/trainer.py), imported only by a
run that profiles: that module imports TensorFlow.

An object store (a gs:// workdir) has no appends: there the event file is
written locally and uploaded whole after each write, and metrics.jsonl is
rewritten whole from the records kept in memory, one object write per call.
"""

import contextlib
import errno
import itertools
import json
import math
import os
import socket
import tempfile
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional

from absl import logging
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import record_writer

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import is_disk_full


def _complete_lines(path: str) -> List[str]:
  """The records of a metrics file: its newline-terminated lines that are JSON
  objects with an integer 'step'.

  A last line without its newline is a record still being written (a reader
  running beside the trainer) or cut short by a killed process; it is
  skipped. Any other line (the file damaged or edited by hand) is skipped with
  one warning naming the file and its line numbers: the file is a log, and
  nothing that reads it needs every line.
  """
  if not storage.exists(path):
    return []
  text = storage.read_text(path)
  records, damaged = [], []
  for number, line in enumerate(text.split('\n')[:-1], start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if isinstance(record, dict) and isinstance(record.get('step'), int):
      records.append(line)
    else:
      damaged.append(number)
  if damaged:
    shown = ', '.join(map(str, damaged[:5])) + (', ...' if len(damaged) > 5 else '')
    logging.warning(
        '%s: skipping %d line(s) that are no metrics record (line %s).', path, len(damaged), shown
    )
  return records


def _finite_or_null(value: Any) -> Any:
  """`value` with every NaN or infinite float in it (in dicts, lists and
  tuples) as None."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {key: _finite_or_null(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite_or_null(item) for item in value]
  return value


def json_text(payload: Any, **dumps_options: Any) -> str:
  """`payload` as strict JSON, which has no NaN or infinity: such a value is
  null. `dumps_options` go to json.dumps (indent, sort_keys)."""
  return json.dumps(_finite_or_null(payload), allow_nan=False, **dumps_options)


def read_metrics(workdir: str) -> List[Dict[str, Any]]:
  """All records of `workdir/metrics.jsonl` in the order written ([] if none);
  a value written null (NaN or infinite) is NaN."""
  return [
      {name: math.nan if value is None else value for name, value in json.loads(line).items()}
      for line in _complete_lines(run_folder.RunFolder(workdir).metrics)
  ]


# Event files of one process are told apart by a counter: two loggers may open
# files in the same workdir within one second (a run stopped and resumed).
_event_file_numbers = itertools.count()


class EventFile:
  """A TensorBoard event file of scalar summaries, flushed after every step.

  The file is a sequence of TFRecord records (TensorBoard's `RecordWriter`),
  each an `Event` protocol buffer; the first names the format version.
  TensorBoard reads `simple_value` summaries as its scalars.
  """

  def __init__(self, directory: str):
    name = (
        f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.'
        f'{os.getpid()}.{next(_event_file_numbers)}.v2'
    )
    self.path = os.path.join(directory, name)
    # On an object store: a local copy, uploaded whole after each write.
    self._upload_to = None
    if storage.is_object_store(directory):
      self._upload_to = self.path
      self._staging = tempfile.TemporaryDirectory(prefix='linformer_events_')
      self.path = os.path.join(self._staging.name, name)
    self._file = open(self.path, 'xb')  # pylint: disable=consider-using-with
    self._records = record_writer.RecordWriter(self._file)
    try:
      self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))
    except OSError:
      # No header (a full disk): no file either, rather than an empty one.
      with contextlib.suppress(OSError):
        self._file.close()
      os.remove(self.path)
      raise

  def _write(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())
    self._records.flush()
    if self._upload_to:
      storage.copy_file(self.path, self._upload_to)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    values = [summary_pb2.Summary.Value(tag=name, simple_value=v) for name, v in scalars.items()]
    self._write(
        event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
    )

  def close(self) -> None:
    self._file.close()
    if self._upload_to:
      self._staging.cleanup()


def _format_duration(seconds: float) -> str:
  """A short duration such as '45s', '4m35s' or '2h05m'."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


class MetricLogger:
  """Writes the scalar metrics and progress lines of one training run."""

  def __init__(self, workdir: str, *, total_steps: int, is_primary: bool = True):
    """Opens the writers; only a primary process creates files in `workdir`.

    Args:
      workdir: the run's directory; event files and metrics.jsonl go here.
      total_steps: the step the run ends at, for the progress line's ETA.
      is_primary: whether this is process 0, the one that writes files.
    """
    self.workdir = workdir
    self._metrics_path = run_folder.RunFolder(workdir).metrics
    self.total_steps = total_steps
    self.is_primary = is_primary
    self._events = None
    # metrics.jsonl's records, kept in memory only for an object store.
    self._records: Optional[List[str]] = None
    if is_primary:
      storage.makedirs(workdir)
      with self._disk_full_as_os_error():
        self._events = EventFile(workdir)
    self._last_step = 0
    self._last_time = time.monotonic()

  @contextlib.contextmanager
  def _disk_full_as_os_error(self) -> Iterator[None]:
    """A full disk, whatever reports it, becomes an OSError naming the
    workdir (a write's own error names no file)."""
    try:
      yield
    except Exception as error:  # pylint: disable=broad-except
      if not is_disk_full(error):
        raise
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.workdir) from None

  def discard_after(self, step: int) -> None:
    """Starts (or resumes) the run at `step`: drops records of later steps.

    A resumed run takes again the steps after its checkpoint, so records that
    a killed run wrote for them would otherwise appear twice. `step` is also
    where the next `progress` call counts its steps from.
    """
    self._last_step = step
    self._last_time = time.monotonic()
    path = self._metrics_path
    if not self.is_primary:
      return
    kept = [line for line in _complete_lines(path) if json.loads(line)['step'] <= step]
    if storage.is_object_store(path):
      self._records = kept
      storage.write_text(path, ''.join(line + '\n' for line in kept))
      return
    if not os.path.exists(path):
      return
    # Replace the file in one rename, so a crash here cannot lose the records.
    partial_path = path + '.tmp'
    with open(partial_path, 'w') as f:
      f.writelines(line + '\n' for line in kept)
    os.replace(partial_path, path)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes scalars of a step; values may be Python, numpy or jax scalars."""
    if 'step' in scalars:
      raise ValueError("'step' is reserved for the step number; rename the metric.")
    values = {name: float(np.asarray(value)) for name, value in scalars.items()}
    step = int(step)
    line = ', '.join(f'{name}={values[name]:.6g}' for name in sorted(values))
    logging.info('[%d] %s', step, line)
    if self._events is not None:
      with self._disk_full_as_os_error():
        self._events.write_scalars(step, values)
    if not self.is_primary:
      return
    record = json_text({'step': step, **values})
    if storage.is_object_store(self.workdir):
      if self._records is None:
        self._records = _complete_lines(self._metrics_path)
      self._records.append(record)
      storage.write_text(self._metrics_path, ''.join(r + '\n' for r in self._records))
      return
    # One write of a whole line per record: a concurrent reader sees either
    # no record or a complete one (see _complete_lines).
    with open(self._metrics_path, 'a') as f:
      f.write(record + '\n')

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` (an evaluation, a checkpoint) out of the next rates."""
    self._last_time += seconds

  def progress(
      self,
      step: int,
      *,
      tokens_per_step: int,
      loss: Optional[float] = None,
      flops_per_step: float = 0.0,
      peak_flops: Optional[float] = None,
  ) -> Dict[str, float]:
    """Logs and prints a progress line; returns the rates since the last call.

    For example `step 120/1000 | loss 5.123 | 3.2 steps/s | 26,000 tokens/s |
    ETA 4m35s`. Rates are measured in wall time since the previous call (or
    since the logger was created or `discard_after` was called), less the time
    given to `exclude`. With the FLOPs a device runs per step, the line also
    shows TFLOP/s per device, and with the device's peak FLOP/s the FLOPs
    utilisation (`mfu`).

    Args:
      step: the step just taken.
      tokens_per_step: tokens processed per step (batch size times length).
      loss: the training loss to show, if any.
      flops_per_step: FLOPs one device runs per step (0 = unknown).
      peak_flops: the device's peak FLOP/s (None = unknown).

    Returns:
      {'steps_per_sec': ..., 'tokens_per_sec': ..., and where known
      'tflops_per_device', 'mfu'}, to write as scalars.
    """
    now = time.monotonic()
    # Two calls within one clock tick must not divide by zero.
    elapsed = max(now - self._last_time, 1e-9)
    steps_per_sec = (step - self._last_step) / elapsed
    tokens_per_sec = steps_per_sec * tokens_per_step
    self._last_step, self._last_time = step, now
    remaining = max(self.total_steps - step, 0)
    eta = _format_duration(remaining / steps_per_sec) if steps_per_sec > 0 else 'unknown'
    parts = [f'step {step}/{self.total_steps}']
    if loss is not None:
      parts.append(f'loss {float(loss):.3f}')
    parts += [f'{steps_per_sec:.3g} steps/s', f'{tokens_per_sec:,.0f} tokens/s']
    rates = {'steps_per_sec': steps_per_sec, 'tokens_per_sec': tokens_per_sec}
    if flops_per_step:
      rates['tflops_per_device'] = flops_per_step * steps_per_sec / 1e12
      parts.append(f"{rates['tflops_per_device']:.3g} TFLOP/s per device")
      if peak_flops:
        rates['mfu'] = flops_per_step * steps_per_sec / peak_flops
        parts.append(f"MFU {rates['mfu']:.1%}")
    parts.append(f'ETA {eta}')
    line = ' | '.join(parts)
    logging.info(line)
    if self.is_primary:
      print(line, flush=True)
    return rates

  def close(self) -> None:
    """Closes the event file."""
    if self._events is not None:
      with self._disk_full_as_os_error():
        self._events.close()
