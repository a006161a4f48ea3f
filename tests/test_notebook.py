"""The experiments notebook runs headlessly from top to bottom on tiny settings,
its section 1 says what its printed numbers show, and its tiny and full modes
keep their runs in folders of their own.

Its kernel is another process, started with this one's environment (the
session's data cache included); the tests that start one are `slow`.
"""

import os
import re

from nbclient import NotebookClient
import nbformat
import numpy as np
import pytest

from linformer_jax import spectrum

NOTEBOOK = 'linformer_tour.ipynb'


def _execute(notebook, experiments):
  NotebookClient(
      notebook,
      timeout=300,
      kernel_name='python3',
      resources={'metadata': {'path': str(experiments)}},
  ).execute()


def _stream_text(notebook) -> str:
  return ''.join(
      output.get('text', '')
      for cell in notebook.cells
      if cell.cell_type == 'code'
      for output in cell.get('outputs', [])
      if output.output_type == 'stream'
  )


def test_random_projection_errors_match_their_expectation():
  rng = np.random.default_rng(3)
  logits = 2.0 * rng.normal(size=(2, 3, 32, 32))
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  values = rng.normal(size=(2, 3, 32, 8))
  projected_lens = np.array([4, 16, 64])
  errors = spectrum.random_projection_errors(p, values, projected_lens, draws=64, seed=0)
  # E||P (R^T R - I) V_i||^2 = (||P_i V_i||^2 + ||P_i||^2 ||V_i||^2) / k for Gaussian R.
  spread = np.sum(np.sum(p**2, (-2, -1)) * np.sum(values**2, (-2, -1)))
  expected = np.sqrt((1 + spread / np.sum((p @ values) ** 2)) / projected_lens)
  np.testing.assert_allclose(errors, expected, rtol=0.05)


def test_the_tour_no_longer_calls_a_random_e_an_approximation(repo_root):
  notebook = nbformat.read(repo_root / 'experiments' / NOTEBOOK, as_version=4)
  markdown = ' '.join(cell.source for cell in notebook.cells if cell.cell_type == 'markdown')
  prose = ' '.join(markdown.split())
  sentences = re.split(r'(?<=[.:])\s+', prose)
  claims = [s for s in sentences if 'random' in s and re.search(r'approximates\b', s)]
  assert not claims
  assert 'is not an approximation of softmax attention' in prose
  assert 'Theorem 2' in prose


@pytest.mark.slow
def test_the_tiny_and_the_full_tour_keep_their_runs_apart(monkeypatch, repo_root):
  """The first cell's workdir by mode: a tiny run never stands where the full
  tour looks for its own (whose model it would refuse)."""
  monkeypatch.delenv('LINFORMER_NOTEBOOK_WORKDIR', raising=False)
  experiments = repo_root / 'experiments'
  workdirs = {}
  for tiny in ('1', '0'):
    monkeypatch.setenv('LINFORMER_NOTEBOOK_TINY', tiny)
    notebook = nbformat.read(experiments / NOTEBOOK, as_version=4)
    notebook.cells = notebook.cells[:2]  # the introduction and the setup cell
    _execute(notebook, experiments)
    workdirs[tiny] = re.search(r'\| workdir: (.+)$', _stream_text(notebook), re.M).group(1)
  assert workdirs == {
      '1': str(repo_root / 'runs' / 'notebook-tiny'),
      '0': str(repo_root / 'runs' / 'notebook-full'),
  }


@pytest.mark.slow
def test_the_tour_section_1_shows_theorem_1s_rate(tmp_path, monkeypatch, repo_root):
  """Section 1 alone: its printed table agrees with the text around it."""
  monkeypatch.setenv('LINFORMER_NOTEBOOK_TINY', '1')
  monkeypatch.setenv('LINFORMER_NOTEBOOK_WORKDIR', str(tmp_path / 'run'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  experiments = repo_root / 'experiments'
  notebook = nbformat.read(experiments / NOTEBOOK, as_version=4)
  section_2 = next(i for i, cell in enumerate(notebook.cells) if cell.source.startswith('## 2.'))
  notebook.cells = notebook.cells[:section_2]
  _execute(notebook, experiments)
  text = _stream_text(notebook)
  length = int(re.search(r'n = (\d+), P R\^T R V against P V', text).group(1))
  table = re.findall(r'^\s*(\d+)\s+([\d.]+)\s+([\d.]+)$', text, re.M)
  rows = np.array([[float(x) for x in row] for row in table])
  projected_lens, errors, scaled = rows.T
  assert len(rows) >= 5
  # "The error falls as k grows, and error * sqrt(k) stays about the same".
  assert np.all(np.diff(errors) < 0)
  assert scaled.max() < 2 * scaled.min()
  # "Its constant is larger than the theorem's sqrt(5 log n)".
  theorem = float(re.search(r'sqrt\(5 log n\) = ([\d.]+)', text).group(1))
  assert theorem == pytest.approx(np.sqrt(5 * np.log(length)), abs=0.01)
  assert scaled.min() > theorem
  # "above 1 ... at every k below n, and drops below 1 only from about k = n on".
  assert np.all(errors[projected_lens < length] > 1)
  assert np.all(errors[projected_lens > length] < 1)
  # A random E = F inside the softmax: every difference above returning zeros' 1.
  differences = [float(x) for x in re.findall(r'random E = F, k = +\d+: .* ([\d.]+)$', text, re.M)]
  assert differences and min(differences) > 1


@pytest.mark.long
@pytest.mark.slow
def test_the_tour_notebook_runs(tmp_path, monkeypatch, repo_root):
  monkeypatch.setenv('LINFORMER_NOTEBOOK_TINY', '1')
  monkeypatch.setenv('LINFORMER_NOTEBOOK_WORKDIR', str(tmp_path / 'run'))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  experiments = repo_root / 'experiments'
  notebook = nbformat.read(experiments / NOTEBOOK, as_version=4)
  _execute(notebook, experiments)
  outputs = [
      output
      for cell in notebook.cells
      if cell.cell_type == 'code'
      for output in cell.get('outputs', [])
  ]
  assert not [o for o in outputs if o.output_type == 'error']
  text = _stream_text(notebook)
  assert 'E = F = I, max |Linformer - full|' in text
  assert 'P R^T R V against P V' in text
  assert 'eval_perplexity' in text
  assert 'guesses' in text  # the trained run, opened with linformer_jax.load
  images = [o for o in outputs if 'image/png' in o.get('data', {})]
  # The loss curve, two benchmark plots, two spectrum plots and one head's P.
  assert len(images) >= 6
  assert os.path.exists(tmp_path / 'run' / 'benchmark' / 'results.csv')
  assert os.path.exists(tmp_path / 'run' / 'spectrum' / 'spectrum.json')
