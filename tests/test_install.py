"""`make` installs the package into .venv, editable: its python imports
linformer_jax and configs from any folder, as a script outside the checkout
does, and finds them in this tree.

The import runs in another process, started in a folder outside the
repository with no PYTHONPATH, so neither the working directory nor pytest's
`pythonpath` setting can supply the package.
"""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = """
import linformer_jax
import configs
print(linformer_jax.__file__)
print(configs.__file__)
"""


def test_the_package_imports_from_outside_the_repository(tmp_path):
  outside = tmp_path / 'elsewhere'
  outside.mkdir()
  assert REPO not in outside.resolve().parents
  environment = {name: value for name, value in os.environ.items() if name != 'PYTHONPATH'}
  result = subprocess.run(
      [sys.executable, '-c', SCRIPT],
      cwd=outside,
      env=environment,
      capture_output=True,
      text=True,
      timeout=120,
  )
  last_line = (result.stderr.strip().splitlines() or ['no error'])[-1]
  assert result.returncode == 0, f'{last_line}: `make venv` installs the package into .venv'
  package, configs = result.stdout.split()
  assert pathlib.Path(package) == REPO / 'linformer_jax' / '__init__.py'
  assert pathlib.Path(configs) == REPO / 'configs' / '__init__.py'
