"""Benchmark settings declared once: the flags their fields make, and back."""

import dataclasses
from typing import Optional, Sequence

from absl import flags
import pytest

from linformer_jax import attention_benchmark
from linformer_jax import benchmark
from linformer_jax import causal_benchmark
from linformer_jax import data_benchmark
from linformer_jax import pytorch_comparison
from linformer_jax import registry
from linformer_jax import settings_flags
from linformer_jax.data.data_config import ClassificationDataConfig
from linformer_jax.data.data_config import DataConfig
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting
from linformer_jax.training import run_config


@dataclasses.dataclass(frozen=True)
class Toy:
  name: str = setting(help_text='A required name.')
  lengths: Sequence[int] = setting((8, 16), 'Lengths.')
  modes: Sequence[str] = setting(('a', 'b'), 'Modes.')
  depth: int = setting(2, 'Depth.')
  rate: float = setting(0.5, 'Rate.')
  fast: bool = setting(False, 'Fast.')
  kind: str = setting('x', 'Kind.', choices=('x', 'y'))
  limit_bytes: float = setting(
      float('inf'),
      'Limit in KiB.',
      flag='limit_kib',
      flag_default=None,
      from_flag=lambda kib: -1.0 if kib is None else kib * 1024,
  )
  workers: int = setting(help_text='Workers.', default_factory=lambda: 3)
  budget: Optional[int] = setting(None, 'Budget.')
  note: str = ''  # no flag


def parsed(*argv):
  flag_values = flags.FlagValues()
  settings_flags.define_flags(Toy, flag_values)
  flag_values(['prog', *argv])
  return flag_values


def test_every_setting_field_is_a_flag_of_its_kind_and_default():
  flag_values = parsed('--name=n')
  assert 'note' not in flag_values
  assert flag_values['lengths'].value == ['8', '16']
  assert flag_values['depth'].value == 2 and flag_values['rate'].value == 0.5
  assert flag_values['fast'].value is False
  assert flag_values['kind'].flag_type() == 'string enum'
  assert flag_values['limit_kib'].value is None and 'limit_bytes' not in flag_values
  assert flag_values['workers'].value is None
  toy = settings_flags.from_flags(Toy, flag_values, note='given')
  assert toy == Toy(name='n', lengths=[8, 16], modes=['a', 'b'], limit_bytes=-1.0, note='given')


def test_flag_values_become_the_fields_values():
  flag_values = parsed(
      '--name=n',
      '--lengths=4',
      '--modes=',
      '--depth=5',
      '--fast',
      '--kind=y',
      '--limit_kib=2',
      '--workers=7',
      '--budget=9',
  )
  toy = settings_flags.from_flags(Toy, flag_values)
  assert (toy.lengths, toy.modes, toy.depth, toy.fast, toy.kind) == ([4], [], 5, True, 'y')
  assert (toy.limit_bytes, toy.workers, toy.budget) == (2048, 7, 9)


def test_a_required_setting_and_a_bad_list_are_refused():
  with pytest.raises(flags.IllegalFlagValueError, match='name'):
    parsed()
  with pytest.raises(ConfigError, match=r'^--lengths=4,x is not allowed: give comma-separated'):
    settings_flags.from_flags(Toy, parsed('--name=n', '--lengths=4,x'))


@dataclasses.dataclass(frozen=True)
class Bounded:
  lengths: Sequence[int] = setting((8, 16), 'Lengths.', minimum=1)
  blocks: Sequence[int] = setting((0,), 'Blocks.', minimum=0)
  modes: Sequence[str] = setting(('a',), 'Modes.', choices=('a', 'b'))
  depth: int = setting(2, 'Depth.', minimum=1)
  kind: str = setting('x', 'Kind.', choices=('x', 'y'))

  def __post_init__(self):
    settings_flags.check(self)


@pytest.mark.parametrize(
    'fields, message',
    [
        (dict(lengths=()), '--lengths= is not allowed: give one or more positive integers.'),
        (dict(lengths=[8, 0]), '--lengths=8,0 is not allowed: give one or more positive integers.'),
        (dict(blocks=[-1]), '--blocks=-1 is not allowed: give one or more integers >= 0.'),
        (dict(modes=['a', 'c']), '--modes=a,c is not allowed: give one or more of a, b.'),
        (dict(modes=[]), '--modes= is not allowed: give one or more of a, b.'),
        (dict(depth=0), '--depth=0 is not allowed: use a positive integer.'),
        (dict(kind='z'), '--kind=z is not allowed: use one of x, y.'),
    ],
)
def test_declared_bounds_refuse_a_value_naming_its_flag(fields, message):
  with pytest.raises(ConfigError) as raised:
    Bounded(**fields)
  assert str(raised.value) == message


def test_declared_bounds_pass_edge_values_and_make_lists_tuples():
  bounded = Bounded(lengths=[1], blocks=[0, 3], modes=['b', 'a'], depth=1, kind='y')
  assert (bounded.lengths, bounded.blocks, bounded.modes) == ((1,), (0, 3), ('b', 'a'))


# The defaults each command had on its own flags, by flag name.
COMMAND_DEFAULTS = {
    benchmark.BenchmarkSettings: {
        'seq_lens': [str(2**p) for p in range(9, 17)],
        'projected_lens': ['128', '256', '512', '1024', '2048'],
        'matmul_sizes': ['1024', '2048', '4096'],
        'memory_limit_gb': None,
        'memory_budget_gb': None,
        'max_batch': 4096,
        'attention_kernel': 'einsum',
        'out': None,
    },
    causal_benchmark.CausalBenchmarkSettings: {
        'contexts': ['1024', '2048', '4096', '8192', '16384', '32768'],
        'linformer_query_blocks': ['0'],
        'sharing': 'layerwise',
        'memory_limit_gb': None,
    },
    pytorch_comparison.ComparisonSettings: {
        'seq_lens': ['512', '1024', '2048', '4096', '8192'],
        'modes': ['forward', 'train'],
        'threads': None,
        'torch_python': '.venv-torch/bin/python',
        'num_layers': 2,
    },
    data_benchmark.Settings: {
        'sizes_mb': ['256', '1024'],
        'stages': ['prepare', 'loader', 'train'],
        'loader_seconds': 10.0,
        'out': None,
    },
    attention_benchmark.AttentionBenchmarkSettings: {
        'seq_lens': ['512', '1024', '2048', '4096', '8192'],
        'projected_len': 256,
        'heads': 12,
        'dtype': 'float32',
    },
}


@pytest.mark.parametrize('settings_type', COMMAND_DEFAULTS, ids=lambda t: t.__name__)
def test_the_commands_flags_keep_their_names_and_defaults(settings_type):
  flag_values = flags.FlagValues()
  settings_flags.define_flags(settings_type, flag_values)
  for name, default in COMMAND_DEFAULTS[settings_type].items():
    assert flag_values[name].default == default, name
  if 'out' in flag_values:
    with pytest.raises(flags.IllegalFlagValueError, match='--out'):
      flag_values(['prog'])


@dataclasses.dataclass(frozen=True)
class Section:
  """A run config section declared with `setting`: bounds, checks, `before`."""

  steps: int = setting(help_text='Steps.', minimum=1)
  rate: float = setting(
      help_text='Rate.', check=lambda r: 0 < r < 1, allowed='use a value in (0, 1)'
  )
  mode: str = setting(help_text='Mode.', choices=('a', 'b'))
  shape: Sequence[int] = setting(help_text='Shape.')
  added: bool = setting(help_text='A field added since the first runs.', before=False)
  given: str = ''  # no config field


def test_a_config_section_is_read_typed_with_what_older_runs_lack_filled():
  values = {'steps': 3, 'rate': 0.5, 'mode': 'b', 'shape': [2, -1], 'other_section': 1}
  section = settings_flags.from_config(Section, values, 'config', given='x')
  assert section == Section(steps=3, rate=0.5, mode='b', shape=(2, -1), added=False, given='x')
  assert settings_flags.fields_added_since(Section) == {'added': False}
  assert settings_flags.from_config(Section, {**values, 'rate': 1 / 4}, 'config').rate == 0.25


@pytest.mark.parametrize(
    'change, message',
    [
        ({'steps': 0}, 'config.steps=0 is not allowed: use a positive integer.'),
        ({'steps': True}, 'config.steps=True is not allowed: use a positive integer.'),
        ({'steps': 2.5}, 'config.steps=2.5 is not allowed: use a positive integer.'),
        ({'rate': 1.0}, r'config.rate=1.0 is not allowed: use a value in \(0, 1\).'),
        ({'rate': float('nan')}, r'config.rate=nan is not allowed: use a value in \(0, 1\).'),
        ({'rate': 'fast'}, "config.rate='fast' is not allowed"),
        ({'mode': 'c'}, "config.mode='c' is not allowed: use one of 'a', 'b'."),
        ({'added': 1}, 'config.added=1 is not allowed: use True or False.'),
        ({'shape': 4}, 'config.shape=4 is not allowed'),
    ],
)
def test_a_config_value_out_of_its_declaration_is_one_line_naming_it(change, message):
  values = {'steps': 3, 'rate': 0.5, 'mode': 'b', 'shape': (2,), **change}
  with pytest.raises(ConfigError, match=message):
    settings_flags.from_config(Section, values, 'config')


def test_a_config_lacking_a_field_every_run_has_is_refused_naming_it():
  with pytest.raises(ConfigError, match="config.data has no field 'steps'; add it"):
    settings_flags.from_config(Section, {'rate': 0.5, 'mode': 'a', 'shape': ()}, 'config.data')


def test_a_model_field_out_of_its_declaration_is_refused_however_the_config_is_built():
  """ModelConfig's fields are declared as every section's: built directly or
  from config.model, a value out of bounds is one line naming the field."""
  for fields, message in (
      (dict(num_heads=0), 'config.model.num_heads=0 is not allowed: use a positive integer.'),
      (dict(scan_layers=1), 'config.model.scan_layers=1 is not allowed: use True or False.'),
      (dict(pooling='max'), "config.model.pooling='max' is not allowed: use one of "),
      (
          dict(dropout_rate=1.0),
          'config.model.dropout_rate=1.0 is not allowed: use a value in [0, 1).',
      ),
  ):
    for build in (
        lambda f: ModelConfig(vocab_size=8, max_len=16, **f),
        lambda f: ModelConfig.from_config(dict(vocab_size=8, max_len=16, **f)),
    ):
      with pytest.raises(ConfigError) as refused:
        build(fields)
      assert str(refused.value).startswith(message), str(refused.value)
  assert ModelConfig(
      vocab_size=8, max_len=16, projected_len=[4, 4], num_layers=2
  ).projected_len == (
      4,
      4,
  )


def test_a_kinds_setting_is_declared_and_worded_as_a_built_in_field():
  """registry.Setting holds a settings_flags.Declaration: the same bounds give
  the same words."""
  declared = registry.Setting('window', int, 8, minimum=1, help_text='w')
  assert declared.allowed == 'use a positive integer'
  assert declared.declaration.help_text == 'w'
  assert not declared.allows(0) and not declared.allows(True) and declared.allows(3)
  choice = registry.Setting('pattern', str, 'a', choices=('a', 'b'))
  assert choice.allowed == "use one of 'a', 'b'" and not choice.allows('c')
  assert not registry.Setting('scale', float, 1.0).allows(float('inf'))


def test_every_declared_field_of_the_tree_has_its_help():
  """The declaration alone gives a field's help: every section's fields and
  every built-in kind's and source's settings carry it."""
  sections = (*run_config.TOP_LEVEL_SECTIONS, ModelConfig, DataConfig, ClassificationDataConfig)
  for section in sections:
    for name, field in settings_flags.config_fields(section).items():
      assert field.metadata['flag'].help_text, f'{section.__name__}.{name}'
  for kind in attention_kinds.BUILT_IN:
    for declared in attention_kinds.REGISTRY.settings_of(kind):
      assert declared.help_text, f'config.model.{declared.name} of {kind!r}'


def test_helpconfig_lists_the_config_with_each_fields_help_and_bounds(run_command):
  result = run_command(
      'train', '--config=configs/tiny.py', '--config.model.max_len=64', '--helpconfig'
  )
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert (
      'config.model.max_len = 64  # n, the sequence length the model is built for '
      '(use a positive integer)'
  ) in lines
  assert 'config.batch_size = 4  # global batch, in sequences (use a positive integer)' in lines
  assert any(line.startswith('config.model.performer_features = 256  # m,') for line in lines)
  assert any(line.startswith('config.data.') for line in lines)
  assert not any(line.startswith('step ') for line in lines)  # it trains nothing
