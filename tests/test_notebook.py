"""The experiments notebook runs headlessly from top to bottom on tiny settings."""

import os

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'experiments', 'linformer_tour.ipynb')


def test_the_tour_notebook_runs(tmp_path, monkeypatch):
  monkeypatch.setenv('LINFORMER_NOTEBOOK_TINY', '1')
  monkeypatch.setenv('LINFORMER_NOTEBOOK_WORKDIR', str(tmp_path / 'run'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(notebook, timeout=300, kernel_name='python3',
                 resources={'metadata': {'path': os.path.join(REPO, 'experiments')}}
                 ).execute()
  outputs = [output for cell in notebook.cells if cell.cell_type == 'code'
             for output in cell.get('outputs', [])]
  assert not [o for o in outputs if o.output_type == 'error']
  text = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
  assert 'E = F = I, max |Linformer - full|' in text
  assert 'eval_perplexity' in text
  images = [o for o in outputs if 'image/png' in o.get('data', {})]
  assert len(images) >= 5  # loss curve, two benchmark plots, two spectrum plots
  assert os.path.exists(tmp_path / 'run' / 'benchmark' / 'results.csv')
  assert os.path.exists(tmp_path / 'run' / 'spectrum' / 'spectrum.json')
