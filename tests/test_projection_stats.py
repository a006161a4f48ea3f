"""projection_stats: slot widths and locality of learned E/F, checked on
matrices whose answers are known, and read from a real tiny run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import small_model_config
from run_helpers import tiny_config

from linformer_jax import projection_stats
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.model import projections
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
      {
          'participation': 4,
          'own_window': 1,
          'norm': 0.5,
          'negative': 0,
          'slot_sum': 1,
          'effective_rank': 8,
      }
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


def test_drift_tells_a_change_common_to_every_slot_from_one_per_slot():
  start = window_means(32, 8)
  common = start + np.linspace(-1, 1, 32)[:, None] * 0.01  # the same vector added to each slot
  stats = projection_stats.drift_stats(common, start)
  assert stats['common_share'] == pytest.approx(1)
  assert stats['drift_slot_sum'] == pytest.approx(0, abs=1e-12)
  assert stats['drift'] == pytest.approx(np.linalg.norm(common - start) / np.linalg.norm(start))
  own = start + 0.01 * (np.arange(8) - 3.5)[None, :]  # per slot, summing to zero over slots
  assert projection_stats.drift_stats(own, start)['common_share'] == pytest.approx(0, abs=1e-12)
  shifted = start + 0.001  # every weight up: the whole change is common, each slot sums +0.032
  assert projection_stats.drift_stats(shifted, start)['drift_slot_sum'] == pytest.approx(0.032)
  assert projection_stats.drift_stats(start, start)['common_share'] == 0


def test_only_projection_weights_are_read_even_where_another_has_their_shape():
  # k = hidden = 4: the position embedding is [n, k] too, and is no E.
  e = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4)
  params = {
      'encoder': {
          'position_embedding': np.zeros((8, 4)),
          'layer_0': {'attention': {'projection': {'key_projection': e}}},
      }
  }
  model = small_model_config(max_len=8, projected_len=4, sharing='none', hidden_dim=4)
  found = dict(projection_stats.learned_matrices(params, model))
  assert list(found) == ['encoder/layer_0/attention/projection/key_projection']
  np.testing.assert_array_equal(np.stack(found[list(found)[0]]), e)  # one per head, E itself


@pytest.fixture(scope='module')
def convex_kind():
  import_extensions(['docs/examples/convex_projection.py'])
  return projections.kind('convex')


@pytest.mark.parametrize(
    'name, per_head',
    [('linear', False), ('linear', True), ('mean', False), ('convex', False), ('convex', True)],
)
def test_the_effective_matrix_is_what_compress_applies_padding_included(
    name, per_head, convex_kind
):
  del convex_kind  # registers 'convex'
  kind = projections.kind(name)
  heads, length, n, k = 2, 12, 16, 4
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  weight = None
  if kind.has_weights:
    shape = ((heads,) if per_head else ()) + (n, k)
    weight = jax.random.normal(keys[0], shape)
  x = jax.random.normal(keys[1], (3, length, heads, 5))
  mask = jnp.arange(length)[None, :] < jnp.array([[12], [7], [3]])
  compressed, _ = kind.compress(x, weight, max_len=n, projected_len=k, key_padding_mask=mask)
  for row in range(3):
    matrix = kind.effective_matrix(
        weight, max_len=n, projected_len=k, length=length, padding_mask=mask[row]
    )
    matrix = np.broadcast_to(np.asarray(matrix, np.float64), (heads, length, k))
    assert not np.any(matrix[:, ~np.asarray(mask[row])]), 'padding rows must be zero'
    expected = np.einsum('hnk,nhd->khd', matrix, np.asarray(x[row], np.float64))
    np.testing.assert_allclose(np.asarray(compressed[row]), expected, atol=2e-5)


def test_a_mean_pools_effective_matrix_holds_window_means():
  matrix = projections.kind('mean').effective_matrix(None, max_len=32, projected_len=8)
  np.testing.assert_allclose(np.asarray(matrix), window_means(32, 8), atol=1e-7)


@pytest.mark.parametrize('name', ['max', 'conv'])
def test_a_kind_that_is_no_fixed_mix_of_positions_is_refused_not_misread(name):
  model = small_model_config(projection=name)
  assert projections.kind(name).effective_matrix(None, max_len=16, projected_len=4) is None
  params = {'layer_0': {'kv_projection': np.ones((4, 8, 8))}}
  with pytest.raises(ConfigError, match=f"projection='{name}' gives no effective E"):
    dict(projection_stats.learned_matrices(params, model))


def test_an_outside_projections_report_describes_its_softmax_not_its_logits(convex_kind):
  model = small_model_config(projection='convex', max_len=8, projected_len=4)
  logits = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (8, 4)))
  ((_, (matrix,)),) = projection_stats.learned_matrices({'kv_projection': logits}, model)
  softmax = np.exp(logits) / np.exp(logits).sum(0)
  np.testing.assert_allclose(matrix, softmax, atol=1e-6)
  assert projection_stats.matrix_stats(matrix, window=2)['slot_sum'] == pytest.approx(1)
  assert projection_stats.initial_stats(model, 4) == {}  # no 'local' nor 'jl' draw of logits
  assert convex_kind.name == 'convex'


@pytest.mark.parametrize(
    'name, init, recorded',
    [
        ('linear', 'local', 'local'),
        ('linear', 'jl', 'jl'),
        ('random', 'jl', 'jl'),
        ('mean', 'jl', 'not used'),  # no weights
        ('conv', 'jl', 'not used'),  # kernels drawn fan-in
        ('convex', 'jl', 'not used'),  # logits drawn by the kind itself
    ],
)
def test_the_report_records_the_init_only_for_kinds_whose_weights_it_draws(
    name, init, recorded, convex_kind
):
  del convex_kind  # registers 'convex'
  model = small_model_config(projection=name, projection_init=init)
  assert projection_stats.recorded_init(model) == recorded


@pytest.mark.slow
def test_the_report_reads_a_runs_learned_matrix_and_its_step_0(tmp_path):
  config = tiny_config(total_steps=2, warmup_steps=1, seed=3, **{'model.projection_init': 'jl'})
  trainer.train_and_evaluate(config, str(tmp_path))
  report = projection_stats.projection_report(config, str(tmp_path))
  assert report['step'] == 2 and report['projection_init'] == 'jl' and report['seed'] == 3
  ((path, learned),) = report['learned'].items()
  assert path.endswith('kv_projection')
  # Two steps move E by about the learning rate per weight, a small fraction
  # of its N(0, 1/8) entries: the step 0 the report draws again is the run's
  # own (another seed's draw would be about 1.4 away).
  assert 0 < learned['drift'] < 0.05
  assert learned['participation'] > 8 and learned['own_window'] < 0.5
  assert report['initial']['8']['local']['own_window'] == pytest.approx(1)
  lines = projection_stats.summary_lines(report)
  assert len(lines) == 5 and lines[0].startswith('step 2 ') and 'drift from step 0' in lines[0]
  assert projection_stats.projection_report(config, str(tmp_path), step=2) == report
  with pytest.raises(ConfigError, match='keeps no checkpoint of step 1; its kept steps are 2'):
    projection_stats.projection_report(config, str(tmp_path), step=1)
