"""Settings a registered kind declares for itself (`registry.Setting`): checked
like the built-in fields of config.model, set on the command line, kept in the
run's config.json; and the small frictions of extensions: one file imported
two ways, `extensions` given as a string (refused alike on the command line
and in Python)."""

import json
import pathlib
import sys
import textwrap

from absl import flags
import ml_collections
from ml_collections import config_flags
import pytest

from configs import tiny
import linformer_jax
from linformer_jax import cli
from linformer_jax import registry
from linformer_jax import sweep as sweep_lib
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_command_extensions
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention_kinds
from linformer_jax.model import projections
from linformer_jax.model.attention_kinds.linformer import Linformer
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.registry import Setting

TEMPERED = 'docs/examples/tempered_attention.py'
REPO = pathlib.Path(__file__).resolve().parent.parent
SMALL = dict(vocab_size=40, max_len=16, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16)


@pytest.fixture(scope='module', autouse=True)
def examples():
  import_extensions([TEMPERED])


def tempered(**settings):
  return ModelConfig(
      **SMALL, projected_len=4, attention='tempered_linformer', extension_settings=settings
  )


def test_a_setting_defaults_and_keeps_only_values_that_differ():
  assert tempered().setting('temperature_init') == 1.0
  assert tempered(temperature_init=1.0) == tempered()
  config = tempered(temperature_init=2)  # an int where a float is declared
  assert config.setting('temperature_init') == 2.0
  assert config.extension_settings == (('temperature_init', 2.0),)
  hash(config)  # Flax modules hold it


@pytest.mark.parametrize('value', [-1.0, 0.0, float('inf'), 'warm', True])
def test_a_bad_setting_is_one_line_naming_the_field_and_what_is_allowed(value):
  with pytest.raises(ConfigError) as error:
    tempered(temperature_init=value)
  message = str(error.value)
  assert message.startswith(f'config.model.temperature_init={value!r} is not allowed')
  assert 'use a finite number > 0' in message and "attention='tempered_linformer'" in message
  assert '\n' not in message


def test_a_setting_of_a_kind_the_config_does_not_use_must_keep_its_default():
  with pytest.raises(ConfigError, match="setting of attention='tempered_linformer', which this"):
    ModelConfig(**SMALL, projected_len=4, extension_settings={'temperature_init': 2.0})
  ModelConfig(**SMALL, projected_len=4, extension_settings={'temperature_init': 1.0})


def test_from_config_takes_declared_fields_and_names_unknown_ones():
  fields = {**SMALL, 'projected_len': 4, 'attention': 'tempered_linformer'}
  config = ModelConfig.from_config(ml_collections.ConfigDict({**fields, 'temperature_init': 3.0}))
  assert config.setting('temperature_init') == 3.0
  with pytest.raises(ConfigError, match='temperatur_init.*temperature_init.*config.extensions'):
    ModelConfig.from_config(ml_collections.ConfigDict({**fields, 'temperatur_init': 3.0}))
  with pytest.raises(ConfigError, match='no registered kind declares'):
    tempered().setting('temperatur_init')


def test_declarations_are_checked():
  with pytest.raises(ValueError, match='type'):
    Setting('window', list, [])
  with pytest.raises(ValueError, match='fails its own check'):
    Setting('window', int, 0, check=lambda value: value > 0)
  # A subclass inherits its parent's settings: one setting, two owners.
  attention_kinds.REGISTRY.register('tempered_twice')(
      type('TemperedTwice', (attention_kinds.REGISTRY.get('tempered_linformer'),), {})
  )
  owners = registry.declared_settings('config.model')['temperature_init'].owners
  assert ('config.model.attention', 'tempered_twice') in owners
  # Another kind may not declare it differently.
  other = type(
      'Other',
      (projections.SequenceProjectionKind,),
      {'settings': (Setting('temperature_init', float, 0.5),)},
  )
  with pytest.raises(ValueError, match='temperature_init is declared already, differently'):
    projections.REGISTRY.register('other_temperature')(other)
  assert 'other_temperature' not in projections.REGISTRY


def test_a_setting_may_not_take_a_built_in_name(monkeypatch):
  clash = type('Clash', (Linformer,), {'settings': (Setting('max_len', int, 8),)})
  # Registered for this test only: every ModelConfig refuses it.
  parts = attention_kinds.REGISTRY._parts  # pylint: disable=protected-access
  monkeypatch.setitem(parts, 'clashing_max_len', clash)
  with pytest.raises(ConfigError, match="max_len is a built-in field.*'clashing_max_len'"):
    tempered()


def test_declared_settings_are_added_to_a_locked_config_with_their_defaults():
  config = tiny.get_config()
  config.model.attention = 'tempered_linformer'
  config.lock()
  registry.add_declared_settings(config)
  assert config.model.temperature_init == 1.0 and config.model.is_locked
  config.model.temperature_init = 2.0
  registry.add_declared_settings(config)  # keeps a value that is set
  assert config.model.temperature_init == 2.0
  assert json.loads(config.to_json())['model']['temperature_init'] == 2.0


def parsed_command_config(argv):
  """The config a command's flags give for configs/tiny.py and `argv`, through
  ml_collections' own override parsing, after `import_command_extensions`."""
  config = tiny.get_config()
  import_command_extensions(config, argv)
  config.lock()
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_dict('config', config, flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


@pytest.mark.parametrize(
    'extensions',
    [
        [f"--config.extensions=('{TEMPERED}',)"],
        ['--config.extensions', f"['{TEMPERED}']"],
        # Repeated, as ml_collections joins a tuple field's values.
        ['--config.extensions=()', f"--config.extensions=('{TEMPERED}',)"],
    ],
)
def test_a_declared_setting_is_overridden_on_the_command_line(extensions):
  argv = [
      'train',
      *extensions,
      '--config.model.attention=tempered_linformer',
      '--config.model.temperature_init=2',
  ]
  config = parsed_command_config(argv)
  assert config.extensions == (TEMPERED,)
  assert config.model.temperature_init == 2.0
  assert ModelConfig.from_config(config.model).setting('temperature_init') == 2.0


def test_extensions_given_as_a_string_are_refused_in_python_in_one_line():
  # ConfigDict itself refuses a string for the tuple field...
  config = tiny.get_config()
  with pytest.raises(TypeError, match="Could not override field 'extensions'"):
    config.extensions = TEMPERED
  # ...and so does everything that takes a config built otherwise.
  for refuse in (
      lambda: import_extensions(TEMPERED),
      lambda: linformer_jax.build(
          ml_collections.ConfigDict({**config.to_dict(), 'extensions': TEMPERED})
      ),
  ):
    with pytest.raises(ConfigError) as error:
      refuse()
    message = str(error.value)
    assert message.startswith(f'config.extensions={TEMPERED!r} is a string; give a tuple')
    assert f"config.extensions = ('{TEMPERED}',) in Python" in message
    assert f'--config.extensions="(\'{TEMPERED}\',)" on the command line' in message
    assert '\n' not in message
  variant = sweep_lib.Variant('one_file', {'extensions': TEMPERED})
  with pytest.raises(ConfigError, match='is a string; give a tuple'):
    sweep_lib.variant_configs(sweep_lib.Sweep(config, [variant]))


@pytest.mark.parametrize(
    'argv',
    [
        [f'--config.extensions={TEMPERED}'],
        ['--config.extensions', TEMPERED],
        [f"--config.extensions='{TEMPERED}'"],
        [f"--config.extensions=('{TEMPERED}',)", f'--config.extensions={TEMPERED}'],
    ],
)
def test_extensions_given_as_a_string_are_refused_on_the_command_line_in_one_line(
    argv, monkeypatch
):
  """Where ml_collections' flag parser alone would take a bare path as a tuple
  of one, the command refuses it as Python does, before anything runs."""
  monkeypatch.setattr(sys, 'argv', ['train', *argv, '--config.model.attention=tempered_linformer'])
  with pytest.raises(cli.ConfigFileError) as error:
    cli.ConfigFileParser('config').parse(str(REPO / 'configs' / 'tiny.py'))
  message = str(error.value)
  assert message.startswith('--config.extensions=') and 'is a string, not a tuple' in message
  assert f'e.g. --config.extensions="(\'{TEMPERED}\',)"' in message and '\n' not in message


KIND_FILE = """
from linformer_jax.model import projections


@projections.REGISTRY.register('{name}')
class Imported(projections.SequenceProjectionKind):
  def compress(self, x, weight, **unused):
    return x, None
"""


@pytest.mark.parametrize('extension_first', [False, True])
def test_one_file_imported_by_import_and_through_extensions_registers_once(
    tmp_path, monkeypatch, extension_first
):
  name = f'imported_twice_{int(extension_first)}'
  (tmp_path / f'{name}.py').write_text(textwrap.dedent(KIND_FILE.format(name=name)))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.chdir(tmp_path)
  if extension_first:
    import_extensions((f'{name}.py',))
  module = __import__(name)
  import_extensions((f'{name}.py', name))
  assert projections.REGISTRY.get(name) is module.Imported


def test_a_different_part_under_a_taken_name_is_still_an_error(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for copy in ('taken_first', 'taken_second'):
    (tmp_path / f'{copy}.py').write_text(textwrap.dedent(KIND_FILE.format(name='taken_once')))
  import_extensions(('taken_first.py',))
  with pytest.raises(ConfigError, match="config.model.projection='taken_once' is registered"):
    import_extensions(('taken_second.py',))


@pytest.mark.parametrize('reads', ['init_from', 'workdir'])
def test_a_command_knows_the_parts_of_the_run_it_starts_from_or_reads(tmp_path, monkeypatch, reads):
  """`--config.init_from=RUN` (fine-tuning) and a run-reading command's
  --workdir import RUN's own extensions, so that the run's kind parses as an
  override without naming its file again."""
  name = f'kind_of_a_run_{reads}'
  (tmp_path / f'{name}.py').write_text(textwrap.dedent(KIND_FILE.format(name=name)))
  run = tmp_path / 'run'
  run.mkdir()
  saved = tiny.get_config().to_dict()
  saved['extensions'] = [f'{name}.py']
  (run / 'config.json').write_text(json.dumps(saved))
  monkeypatch.chdir(tmp_path)
  argv = ['train', f'--config.{reads}={run}' if reads == 'init_from' else f'--workdir={run}']
  monkeypatch.setattr(sys, 'argv', argv)
  assert name not in projections.REGISTRY
  parser = cli.ConfigFileParser('config', reads_run=reads == 'workdir')
  parser.parse(str(REPO / 'configs' / 'tiny.py'))
  assert name in projections.REGISTRY
