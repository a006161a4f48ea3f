"""projection_stats: slot widths and locality of learned E/F, checked on
matrices whose answers are known, and read from a real tiny run."""

import numpy as np
import pytest
from run_helpers import tiny_config

from linformer_jax.analysis import projection_stats
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import trainer


def window_means(n, k):
  window = n // k
  matrix = np.zeros((n, k))
  for j in range(k):
    matrix[j * window : (j + 1) * window, j] = 1 / window
  return matrix


def test_a_matrix_of_window_means_mixes_its_window_and_nothing_else():
  stats = projection_stats.matrix_stats(window_means(32, 8), window=4)
  assert stats == pytest.approx(
      {'participation': 4, 'own_window': 1, 'norm': 0.5, 'negative': 0, 'effective_rank': 8}
  )


def test_slots_moved_off_their_windows_or_spread_evenly_are_told_apart():
  shifted = np.roll(window_means(32, 8), 4, axis=0)  # each slot reads its neighbour's window
  assert projection_stats.matrix_stats(shifted, window=4)['own_window'] == pytest.approx(0)
  even = np.full((32, 8), -0.1)
  stats = projection_stats.matrix_stats(even, window=4)
  assert stats['participation'] == pytest.approx(32)
  assert stats['own_window'] == pytest.approx(4 / 32)
  assert stats['negative'] == 1 and stats['effective_rank'] == pytest.approx(1)


def test_fresh_draws_have_the_widths_of_their_initialisations():
  model = ModelConfig.from_config(tiny_config(**{'model.max_len': 256}).model.to_dict())
  stats = projection_stats.initial_stats(model, 8)
  assert stats['local']['participation'] == pytest.approx(32)
  assert stats['local']['own_window'] == pytest.approx(1)
  # Gaussian and uniform entries: about n/3 and n/1.8 positions per slot.
  assert 60 < stats['jl']['participation'] < 110
  assert 110 < stats['xavier']['participation'] < 170


@pytest.mark.slow
def test_the_report_reads_a_runs_learned_matrix(tmp_path):
  config = tiny_config(total_steps=2, warmup_steps=1, **{'model.projection_init': 'local'})
  trainer.train_and_evaluate(config, str(tmp_path))
  report = projection_stats.projection_report(config, str(tmp_path))
  assert report['step'] == 2 and report['projection_init'] == 'local'
  ((path, learned),) = report['learned'].items()
  assert path.endswith('kv_projection')
  # Two steps move a local E only a little off its windows (4 positions each).
  assert 0.9 < learned['own_window'] <= 1 and 3.9 < learned['participation'] < 5
  assert report['initial']['8']['local']['own_window'] == pytest.approx(1)
  lines = projection_stats.summary_lines(report)
  assert len(lines) == 4 and lines[0].startswith('step 2 ')
