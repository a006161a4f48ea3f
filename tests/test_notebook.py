"""The experiments notebook runs headlessly from top to bottom on tiny settings.

Its kernel is another process, started with this one's environment (the
session's data cache included); the test is `slow`.
"""

import os

from nbclient import NotebookClient
import nbformat
import pytest


@pytest.mark.long
@pytest.mark.slow
def test_the_tour_notebook_runs(tmp_path, monkeypatch, repo_root):
  monkeypatch.setenv('LINFORMER_NOTEBOOK_TINY', '1')
  monkeypatch.setenv('LINFORMER_NOTEBOOK_WORKDIR', str(tmp_path / 'run'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  experiments = repo_root / 'experiments'
  notebook = nbformat.read(experiments / 'linformer_tour.ipynb', as_version=4)
  NotebookClient(
      notebook,
      timeout=300,
      kernel_name='python3',
      resources={'metadata': {'path': str(experiments)}},
  ).execute()
  outputs = [
      output
      for cell in notebook.cells
      if cell.cell_type == 'code'
      for output in cell.get('outputs', [])
  ]
  assert not [o for o in outputs if o.output_type == 'error']
  text = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
  assert 'E = F = I, max |Linformer - full|' in text
  assert 'eval_perplexity' in text
  assert 'guesses' in text  # the trained run, opened with linformer_jax.load
  images = [o for o in outputs if 'image/png' in o.get('data', {})]
  # The loss curve, two benchmark plots, two spectrum plots and one head's P.
  assert len(images) >= 6
  assert os.path.exists(tmp_path / 'run' / 'benchmark' / 'results.csv')
  assert os.path.exists(tmp_path / 'run' / 'spectrum' / 'spectrum.json')
