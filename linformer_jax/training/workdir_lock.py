"""One run per workdir: `flock` on a local folder, a lease object on gs://.

A local workdir is locked with `flock` on the folder itself: the kernel drops
the lock when the holder exits, however it dies, so a dead run never blocks
the next one.

An object store has no locks and no kernel to drop one. There the lock is the
object WORKDIR/.lock (`run_folder`), created only if absent (a generation-0
precondition: of two runs starting together, exactly one creates it). Its
holder rewrites it every RENEW_SECONDS, each write conditional on the
generation it last wrote, and deletes it when the run ends. A lock not
renewed for LEASE_SECONDS belongs to a run that died (a preempted VM, say):
the next run takes it over, again conditionally, so only one run can. A
holder whose renewal finds another run's lock has lost the workdir and logs
an error; the run goes on (its saves then compete with the other run's).
"""

import contextlib
import datetime
import fcntl
import json
import os
import socket
import threading
import time
from typing import Iterator

from absl import logging
import jax

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.errors import ConfigError

LEASE_SECONDS = 120.0
RENEW_SECONDS = 30.0


@contextlib.contextmanager
def exclusive_workdir(workdir: str) -> Iterator[None]:
  """Holds an exclusive lock on `workdir` (on process 0) while a run uses it.

  A run that stops before it keeps what it made (`storage.keep_created`,
  called once it passed every check that can refuse it) leaves the file
  system as it found it: the local folder and the parents this call created,
  and the files the run noted (a tokenizer trained for it), are removed
  again (`storage.undone_if_refused`).

  Raises:
    ConfigError: another run holds the workdir, or it cannot be a folder.
  """
  if jax.process_index() != 0:
    yield
    return
  with storage.undone_if_refused():
    if storage.is_object_store(workdir):
      with _Lease(workdir):
        yield
      return
    with _locked_folder(workdir):
      yield


@contextlib.contextmanager
def _locked_folder(workdir: str) -> Iterator[None]:
  """Holds `flock` on the local folder `workdir`, made (and noted for
  `storage.undone_if_refused`) if missing."""
  try:
    storage.makedirs(workdir)
    folder = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
  except OSError as error:
    raise ConfigError(
        f'--workdir={workdir!r} cannot be a run folder ({error.strerror}); give the path '
        'of a folder you can write to.'
    ) from None
  try:
    try:
      fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise ConfigError(
          f'{workdir} is in use by another run; wait for it to finish or use another --workdir.'
      ) from None
    storage.check_folder(workdir)
    yield
  finally:
    os.close(folder)


def _owner() -> str:
  return json.dumps({'host': socket.gethostname(), 'pid': os.getpid(), 'time': time.time()})


def _holder(text: str) -> str:
  """'host H, pid P' of a lock object's text (`_owner`), or what it holds
  instead when another program wrote it."""
  try:
    holder = json.loads(text)
    return f'host {holder["host"]}, pid {holder["pid"]}'
  except (ValueError, TypeError, KeyError):
    return f'an unknown holder: {run_folder.LOCK_OBJECT} holds {text[:40]!r}'


class _Lease:
  """The lock object of a gs:// workdir; see the module docstring."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    lock_object = run_folder.RunFolder(workdir).lock_object
    self.bucket_name, _, self.name = lock_object[len('gs://') :].partition('/')
    self._generation = None
    self._stop = threading.Event()
    self._thread = None
    self._client = None

  def _blob(self):
    if self._client is None:
      from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top

      self._client = gcs.Client()
    return self._client.bucket(self.bucket_name).blob(self.name)

  def _refused(self, reason: str) -> ConfigError:
    return ConfigError(f'--workdir={self.workdir!r} {reason}')

  def __enter__(self) -> '_Lease':
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

    blob = self._blob()
    try:
      blob.upload_from_string(_owner(), if_generation_match=0)
    except exceptions.PreconditionFailed:
      blob.reload()
      age = (datetime.datetime.now(datetime.timezone.utc) - blob.updated).total_seconds()
      if age < LEASE_SECONDS:
        holder = _holder(blob.download_as_text())
        raise self._refused(
            f'is in use by another run ({holder}, renewed {age:.0f} s ago); wait for it to '
            'finish, use another --workdir, or, if that run is gone, run again after '
            f'{LEASE_SECONDS - age:.0f} s when its lock expires.'
        ) from None
      try:  # A dead run's lock: take it over, unless another run just did.
        blob.upload_from_string(_owner(), if_generation_match=blob.generation)
      except exceptions.PreconditionFailed:
        raise self._refused('was just taken over by another run; use another --workdir.') from None
      logging.warning('Took over the lock of %s, not renewed for %.0f s.', self.workdir, age)
    except exceptions.GoogleAPIError as error:
      raise self._refused(f'cannot hold a lock object ({error}).') from None
    self._generation = blob.generation
    self._thread = threading.Thread(target=self._renew, daemon=True, name='workdir_lease')
    self._thread.start()
    return self

  def _renew(self) -> None:
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

    while not self._stop.wait(RENEW_SECONDS):
      blob = self._blob()
      try:
        blob.upload_from_string(_owner(), if_generation_match=self._generation)
        self._generation = blob.generation
      except exceptions.PreconditionFailed:
        logging.error('Another run took over %s: this run no longer holds it.', self.workdir)
        return
      except exceptions.GoogleAPIError as error:  # retried at the next renewal
        logging.warning('Renewing the lock of %s failed: %s', self.workdir, error)

  def __exit__(self, *exc_info) -> None:
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    with contextlib.suppress(exceptions.GoogleAPIError):
      self._blob().delete(if_generation_match=self._generation)
