"""The run builder and the task objects: abstract state, shardings, evaluation-only loading."""

import dataclasses
import json
import pathlib

import jax
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec
import ml_collections
import numpy as np
import optax
import pytest

from configs import causal_lm
from configs import classification
from configs import default
from configs import tiny
from linformer_jax import registry
from linformer_jax import run_folder
from linformer_jax import settings_flags
from linformer_jax.errors import ConfigError
from linformer_jax.training import optimization
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import run_loading
from linformer_jax.training import sharding
from linformer_jax.training import tasks
from linformer_jax.training import train_steps
from linformer_jax.training import trainer


def tiny_config(**overrides):
  config = tiny.get_config()
  for key, value in overrides.items():
    config[key] = value
  return config


def test_the_abstract_state_is_what_initialisation_returns():
  config = tiny_config()
  parts = run_builder.build_parts(config)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  abstract = parts.abstract_train_state(optimizer)
  real = jax.eval_shape(
      lambda rng: train_steps.init_train_state(
          rng, model=parts.model, optimizer=optimizer, seq_len=config.model.max_len
      ),
      jax.random.PRNGKey(0),
  )
  assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(real)
  for want, got in zip(jax.tree_util.tree_leaves(real), jax.tree_util.tree_leaves(abstract)):
    assert (want.shape, want.dtype) == (got.shape, got.dtype)


def test_optimizer_moments_take_exactly_their_parameters_sharding():
  # An abstract 2 x 4 mesh: heads, MLP units and vocabulary split over 'model'.
  config = tiny_config(mesh_shape=(1, 1))
  parts = run_builder.build_parts(config)
  parts = dataclasses.replace(parts, mesh=AbstractMesh((2, 4), sharding.MESH_AXES))
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  state = parts.abstract_train_state(optimizer)
  param_specs = jax.tree_util.tree_map(lambda x: x.sharding.spec, state.params)
  split = [
      spec
      for spec in jax.tree_util.tree_leaves(
          param_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
      )
      if 'model' in spec
  ]
  assert split, 'the model axis must split some parameters for this test to mean anything'
  adam = [
      s
      for s in jax.tree_util.tree_leaves(
          state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
      )
      if isinstance(s, optax.ScaleByAdamState)
  ]
  assert len(adam) == 1
  for moments in (adam[0].mu, adam[0].nu):
    moment_specs = jax.tree_util.tree_map(lambda x: x.sharding.spec, moments)
    assert moment_specs == param_specs
  assert adam[0].count.sharding.spec == PartitionSpec()
  assert state.step.sharding.spec == PartitionSpec()


def test_an_unknown_task_names_the_choices():
  with pytest.raises(ConfigError, match="config.task='translation'.*masked_lm"):
    run_builder.build_parts(tiny_config(task='translation'))


@pytest.mark.parametrize(
    'name,sums,expected',
    [
        (
            'masked_lm',
            {'loss_sum': 6.0, 'correct_sum': 1.0, 'weight_sum': 4.0},
            {'loss': 1.5, 'accuracy': 0.25, 'perplexity': np.exp(1.5), 'masked_tokens': 4.0},
        ),
        (
            'classification',
            {'loss_sum': 2.0, 'correct_sum': 3.0, 'weight_sum': 5.0},
            {'loss': 0.4, 'accuracy': 0.6, 'examples': 5.0},
        ),
    ],
)
def test_task_metrics_from_summed_batches(name, sums, expected):
  metrics = tasks.TASKS.get(name)().metrics(sums)
  assert metrics.keys() == expected.keys()
  for key, value in expected.items():
    assert metrics[key] == pytest.approx(value)


def test_reference_models_score_their_evaluation_batches():
  # Unigram: train counts 3, 1 (add-one: 4/6, 2/6); masked targets 0, 1, 1.
  batches = [{'targets': np.array([[0, 1], [1, 0]]), 'weights': np.array([[1.0, 1.0], [1.0, 0.0]])}]
  expected = np.exp(-(np.log(4 / 6) + 2 * np.log(2 / 6)) / 3)
  assert tasks.unigram_perplexity(np.array([3, 1]), batches) == pytest.approx(expected)
  # Majority class 1 of train counts 2, 5; labels 1, 0, 1 and a weight-0 filler.
  batches = [{'labels': np.array([1, 0, 1, 1]), 'weights': np.array([1.0, 1.0, 1.0, 0.0])}]
  assert tasks.majority_accuracy(np.array([2, 5]), batches) == pytest.approx(2 / 3)


@pytest.mark.slow
def test_evaluation_only_loading_matches_the_run_and_builds_no_training_iterator(tmp_path):
  config = tiny_config(total_steps=4, warmup_steps=2, eval_every=4, log_every=2, checkpoint_every=4)
  workdir = str(tmp_path)
  results = trainer.train_and_evaluate(config, workdir)
  loaded = run_loading.load_run(config, workdir, with_data=True)
  assert loaded.step == 4
  assert loaded.data.train_iterator is None
  assert sorted(loaded.variables) == ['params']
  assert loaded.evaluate()['loss'] == pytest.approx(results['eval_loss'], rel=1e-6)


def test_evaluation_only_loading_of_a_folder_without_checkpoint_is_an_error(tmp_path):
  with pytest.raises(ConfigError, match='holds no checkpoint'):
    run_loading.load_run(tiny_config(), str(tmp_path), with_data=True)


def test_a_config_saved_before_the_newer_fields_builds_with_the_values_of_its_time(tmp_path):
  saved = tiny_config().to_dict()
  added = run_config.fields_added_since('masked_lm')
  for field in added['']:
    saved.pop(field)
  for field in added['data']:
    saved['data'].pop(field)
  pathlib.Path(run_folder.RunFolder(str(tmp_path)).config).write_text(json.dumps(saved))
  config = run_builder.saved_config(str(tmp_path))
  # Such a run trained every weight alike and stopped at its first bad step.
  assert config.projection_remove_common_update is False
  assert (config.max_skipped_steps, config.spike_factor, config.task) == (0, 0.0, 'masked_lm')
  assert config.data.sequences_per_shard == 8192 and config.data.cache_dir == ''
  settings = run_builder.build_parts(config).settings
  assert settings.optimizer.projection_remove_common_update is False
  assert settings.optimizer.learning_rate == saved['learning_rate']


def test_completing_a_new_config_changes_nothing():
  assert run_config.complete(tiny_config()).to_dict() == tiny_config().to_dict()


def test_a_saved_setting_of_a_kind_not_imported_now_does_not_block_the_run():
  """A run trained where an extension declared a setting saves it at its
  default; read back where that extension is not imported (another process),
  the setting belongs to no kind of the run, so it is not compared. A
  setting both sides know is compared, at its default where either lacks it."""
  config = run_config.complete(tiny.get_config())
  saved = {
      'model': {**config.model.to_dict(), 'a_setting_of_an_unimported_kind': 1.0},
      'data': config.data.to_dict(),
  }
  typed = run_config.RunConfig.from_config
  run_config.check_same_model(saved, typed(config), 'runs/x')  # no error
  del saved['model']['hidden_dim']  # saved before the field existed: read at its default
  config.model.hidden_dim = run_config.MODEL_DEFAULTS['hidden_dim']
  run_config.check_same_model(saved, typed(config), 'runs/x')  # no error
  config.model.hidden_dim += 8
  with pytest.raises(ConfigError, match='hidden_dim='):
    run_config.check_same_model(saved, typed(config), 'runs/x')


def test_the_loop_settings_are_the_configs_fields_typed_and_checked():
  config = tiny_config(total_steps=7, log_every=2, profile_steps=(2, 3), seed=5)
  loop = run_config.RunConfig.from_config(config).loop
  assert (loop.total_steps, loop.log_every, loop.seed) == (7, 2, 5)
  assert loop.batch_size == config.batch_size and loop.keep_checkpoints == config.keep_checkpoints
  assert loop.profile_window == (2, 3)
  assert run_config.RunConfig.from_config(tiny_config(profile_steps=())).loop.profile_window is None
  config = ml_collections.ConfigDict({**tiny_config().to_dict(), 'seed': 1.5})  # as JSON may give
  with pytest.raises(ConfigError, match=r'config.seed=1.5 is not allowed: use an integer'):
    run_config.RunConfig.from_config(config)


@pytest.mark.parametrize('config_file', [default, classification])
def test_every_field_of_a_config_is_declared_once(config_file):
  """The typed tree names every top-level and data field of configs/default.py
  and configs/classification.py in exactly one section, so each has one
  declaration: type, bounds, help and the value of older runs."""
  config = config_file.get_config()
  settings = run_config.RunConfig.from_config(config)
  declared = {}
  for section, types in (('', run_config.TOP_LEVEL_SECTIONS), ('data', (type(settings.data),))):
    for settings_type in types:
      for name in settings_flags.config_fields(settings_type):
        declared.setdefault((section, name), []).append(settings_type.__name__)
  assert {key: owners for key, owners in declared.items() if len(owners) > 1} == {}
  top_level = {('', name) for name in config if name not in ('model', 'data')}
  data = {('data', name) for name in config.data}
  assert top_level | data == set(declared)
  assert settings.optimizer.total_steps == settings.loop.total_steps
  assert settings.mesh.axis_rules == tuple(map(tuple, config.axis_rules))
  assert settings.data.to_dict() == {
      name: tuple(value) if isinstance(value, list) else value
      for name, value in config.data.to_dict().items()
  }


@pytest.mark.parametrize('config_file', [default, classification, causal_lm, tiny])
@pytest.mark.parametrize('declared', [False, True], ids=['as in the file', 'settings declared'])
def test_the_typed_tree_gives_back_the_config_it_was_typed_from(config_file, declared):
  """`RunConfig.to_dict()`, what a run saves and compares with a saved run's,
  is the completed config through JSON: the fields `ModelConfig` resolves
  (projection_init='') and, once a command has added them
  (`registry.add_declared_settings`), the registered parts' settings at their
  defaults, which it leaves out, as the config set them. Typed again, it
  gives the same settings."""
  config = config_file.get_config()
  if declared:
    registry.add_declared_settings(config)
  settings = run_config.RunConfig.from_config(config)
  as_json = lambda tree: json.loads(json.dumps(tree, sort_keys=True))
  assert as_json(settings.to_dict()) == as_json(run_config.complete(config).to_dict())
  again = ml_collections.ConfigDict(settings.to_dict())
  assert run_config.RunConfig.from_config(again) == settings


def test_built_parts_attend_with_a_kernel_and_save_the_one_configured():
  config = tiny_config()
  parts = run_builder.build_parts(config)
  assert (config.model.attention_kernel, parts.model_config.attention_kernel) == ('auto', 'einsum')
  assert parts.settings.to_dict() == run_config.RunConfig.from_config(config).to_dict()
