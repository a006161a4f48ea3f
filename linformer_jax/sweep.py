"""Ablation sweeps: train every variant of a sweep file, then tabulate and plot.

  python -m linformer_jax.sweep --sweep configs/sweeps/projected_len.py \
      --workdir runs/sweeps/projected_len [--only=k16,transformer] \
      [--set=total_steps=50 --set=warmup_steps=5]

A sweep file's `get_sweep()` returns a `Sweep` (import `Sweep` and `Variant`
from this module): a base config and named `Variant`s of dotted overrides.
Each variant trains in WORKDIR/<name>; a finished one is skipped and an
interrupted one resumes. The report (`sweep_report`) is written at the end,
also when an error stops the sweep. Bad input ends with a one-line error and
exit code 2 before anything is trained (docs/training.md, "Sweeps"). A
variant that diverges stops the sweep the same way, its line giving the
sweep's own command to go on with that variant (`--only=NAME
--set=restore_step=N --set=learning_rate=R`).
"""

import ast
import copy
import dataclasses
import difflib
import importlib.util
import json
import math
import os
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import ml_collections

from linformer_jax import cli
from linformer_jax import run_folder
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.analysis.sweep_report import REPORT_FILE
from linformer_jax.analysis.sweep_report import describe
from linformer_jax.analysis.sweep_report import figure_file
from linformer_jax.analysis.sweep_report import report_table
from linformer_jax.analysis.sweep_report import results_of
from linformer_jax.analysis.sweep_report import write_report
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.registry import add_declared_settings
from linformer_jax.settings_flags import setting
from linformer_jax.training import divergence
from linformer_jax.training import run_config
from linformer_jax.training import trainer
from linformer_jax.training import training_run

_VARIANT_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+-]*$')


@dataclasses.dataclass(frozen=True)
class Variant:
  """One run of a sweep."""

  name: str  # the run's subdirectory of the sweep's workdir and its row label
  # Dotted config keys and the values they take in this run.
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A base config and the variants that change it."""

  base: ml_collections.ConfigDict  # the config every variant starts from
  variants: Sequence[Variant]  # in the order they train and appear in the report
  title: str = 'Sweep'  # the heading of results.md and of the figure


def _checked_sweep(candidate: Any, origin: str) -> Sweep:
  """A `Sweep` with unique, path-safe variant names, or a ConfigError."""
  # Compared by attributes, not by class: run as `python -m`, this module is
  # `__main__`, while sweep files import `linformer_jax.sweep`.
  base = getattr(candidate, 'base', None)
  variants = getattr(candidate, 'variants', None)
  if not isinstance(base, ml_collections.ConfigDict) or variants is None:
    raise ConfigError(
        f'{origin}: get_sweep() must return a Sweep(base=ConfigDict, '
        'variants=[Variant(name, overrides), ...]).'
    )
  checked = []
  for variant in variants:
    name, overrides = getattr(variant, 'name', None), getattr(variant, 'overrides', None)
    if not isinstance(name, str) or not _VARIANT_NAME.match(name):
      raise ConfigError(
          f'{origin}: variant name {name!r} is not allowed: use letters, '
          'digits and _.+- (it names a directory).'
      )
    if not isinstance(overrides, Mapping):
      raise ConfigError(f'{origin}: variant {name!r} needs a dict of overrides, not {overrides!r}.')
    if name in [v.name for v in checked]:
      raise ConfigError(f'{origin}: two variants are named {name!r}.')
    checked.append(Variant(name, dict(overrides)))
  if not checked:
    raise ConfigError(f'{origin}: the sweep has no variants.')
  title = getattr(candidate, 'title', None) or 'Sweep'
  return Sweep(base=base, variants=tuple(checked), title=title)


def load_sweep(path: str) -> Sweep:
  """Runs the sweep file at `path` and returns its `get_sweep()`."""
  if not os.path.isfile(path):
    raise ConfigError(
        f'--sweep={path}: no such file; pass a sweep file such as configs/sweeps/projected_len.py.'
    )
  module_name = '_sweep_file_' + re.sub(r'\W', '_', os.path.splitext(os.path.basename(path))[0])
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    get_sweep = getattr(module, 'get_sweep', None)
    candidate = get_sweep() if callable(get_sweep) else None
  except ConfigError:
    raise
  except Exception as error:  # pylint: disable=broad-exception-caught
    # The sweep file is user code: any exception means it cannot be loaded.
    raise ConfigError(f'--sweep={path} cannot be loaded: {type(error).__name__}: {error}') from None
  if not callable(get_sweep):
    raise ConfigError(f'{path} defines no get_sweep() function.')
  return _checked_sweep(candidate, path)


def _field(
    config: ml_collections.ConfigDict, key: str, origin: str
) -> Tuple[ml_collections.ConfigDict, str]:
  """The ConfigDict holding dotted `key` and the field's name in it."""
  *groups, name = key.split('.')
  node, path = config, 'config'
  for group in groups + [name]:
    if not isinstance(node, ml_collections.ConfigDict) or group not in node:
      known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      guess = difflib.get_close_matches(group, known, n=1)
      hint = f'; did you mean {path}.{guess[0]}?' if guess else ''
      raise ConfigError(f'{origin}: unknown config key {key!r} (no field {path}.{group}){hint}')
    parent, node, path = node, node[group], f'{path}.{group}'
  if isinstance(node, ml_collections.ConfigDict):
    raise ConfigError(
        f'{origin}: config key {key!r} is a group of fields; set one '
        f'of them, e.g. {key}.{next(iter(node.keys()), "FIELD")}.'
    )
  return parent, name


def _is_per_layer(value: Any) -> bool:
  """Whether `value` is ints, one per layer, e.g. (16, 32, 64)."""
  if not isinstance(value, (tuple, list)) or not value:
    return False
  return all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _assign(config: ml_collections.ConfigDict, key: str, value: Any, origin: str) -> None:
  """Sets dotted `key`, keeping ml_collections' type rules but one: an int field
  also takes ints per layer, so that model.projected_len can be one k per layer."""
  parent, name = _field(config, key, origin)
  if isinstance(value, list):
    value = tuple(value)
  try:
    parent[name] = value
  except TypeError:
    if not (parent.get_type(name) is int and _is_per_layer(value)):
      raise ConfigError(
          f'{origin}: {key}={value!r} is not allowed: config.{key} '
          f'holds a {parent.get_type(name).__name__}.'
      ) from None
    with parent.ignore_type():
      parent[name] = value


_BOOLEANS = {'true': True, '1': True, 'yes': True, 'false': False, '0': False, 'no': False}


def _parse_value(text: str, field_type: type) -> Any:
  """`text` as a value of `field_type`; raises ValueError, KeyError (a bool)
  or SyntaxError if it is not one."""
  if field_type is bool:
    return _BOOLEANS[text.strip().lower()]
  if field_type is str:
    return text
  if field_type is float:
    return float(text)
  if field_type is int:
    try:
      return int(text)
    except ValueError:
      value = ast.literal_eval(text)
      if not _is_per_layer(value):
        raise
      return tuple(value)
  value = ast.literal_eval(text)
  if field_type in (tuple, list) and not isinstance(value, (tuple, list)):
    raise ValueError(text)
  return tuple(value) if field_type in (tuple, list) else value


def parse_sets(base: ml_collections.ConfigDict, sets: Sequence[str]) -> Dict[str, Any]:
  """`KEY=VALUE` strings as typed values, each of its base field's type."""
  parsed = {}
  for item in sets:
    key, equals, text = item.partition('=')
    key = key.strip()
    if not equals or not key:
      raise ConfigError(f'--set={item!r} is not KEY=VALUE, e.g. --set=total_steps=50.')
    parent, name = _field(base, key, f'--set={item}')
    field_type = parent.get_type(name)
    try:
      value = _parse_value(text, field_type)
    except (ValueError, KeyError, SyntaxError, TypeError):
      raise ConfigError(
          f'--set={item}: {text!r} is not a valid {field_type.__name__} for '
          f'config.{key} (now {parent[name]!r}).'
      ) from None
    if field_type is float and not math.isfinite(value):
      raise ConfigError(
          f'--set={item}: config.{key} needs a finite number, not {text!r} '
          f'(now {parent[name]!r}).'
      )
    parsed[key] = value
  return parsed


def variant_configs(sweep: Sweep, sets: Sequence[str] = ()) -> Dict[str, ml_collections.ConfigDict]:
  """Every variant's validated config, in order: base, its overrides, then sets,
  `~` made the home folder in its paths; a ConfigError naming the variant and
  the key for an unknown key, a bad value or a path no library could use
  (`storage.check_paths`)."""
  # The parts that the sweep and its variants name register first, so that
  # the settings they declare are fields a variant or a --set may assign.
  base = copy.deepcopy(sweep.base)
  import_extensions(base.get('extensions'))
  for variant in sweep.variants:
    import_extensions(variant.overrides.get('extensions'))
  add_declared_settings(base)
  typed_sets = parse_sets(base, sets)
  configs = {}
  for variant in sweep.variants:
    config = copy.deepcopy(base)
    for key, value in variant.overrides.items():
      _assign(config, key, value, f'sweep variant {variant.name!r}')
    for key, value in typed_sets.items():
      _assign(config, key, value, f'--set={key}')
    try:
      # A variant may name parts of its own (config.extensions); they register first.
      import_extensions(run_config.complete(config).extensions)
      run_config.RunConfig.from_config(config)
      storage.check_paths(run_config.expand_paths(config), run_config.LOCAL_PATHS)
    except ConfigError as error:
      raise ConfigError(f'sweep variant {variant.name!r}: {error}') from None
    configs[variant.name] = config
  return configs


def _selected(sweep: Sweep, only: Optional[Sequence[str]]) -> List[Variant]:
  names = [variant.name for variant in sweep.variants]
  unknown = [name for name in only or () if name not in names]
  if unknown:
    raise ConfigError(
        f'--only: no variant named {", ".join(unknown)}; the sweep has {", ".join(names)}.'
    )
  return [variant for variant in sweep.variants if not only or variant.name in only]


class VariantDivergedError(ConfigError):
  """A variant of the sweep diverged (`divergence.DivergenceError`): how to
  go on with it in the sweep's own flags.

  Attributes:
    summary: the variant and what happened (one line).
    advice: 'Go on with ...', up to the command.
    flags: the sweep's flags to go on with it: --only=NAME, and
      --set=restore_step=N and --set=learning_rate=R where they apply.
    dropped: flags of the sweep's command to drop (a --set of the learning
      rate, to go back to the sweep file's own).
    set_aside: the variant's folder, where none of its kept steps is sound
      (it must be moved aside to start the variant again), else None.
  """

  def __init__(
      self,
      variant: str,
      variant_dir: str,
      error: divergence.DivergenceError,
      own_learning_rate: Optional[float],
  ):
    self.summary = f'sweep variant {variant!r}: {error.summary}'
    rate, why = divergence.advised_learning_rate(
        error.learning_rate, own_learning_rate, 'the sweep file'
    )
    self.advice = f'Go on with {why}'
    self.flags = [f'--only={variant}']
    if error.restore_step is not None:
      self.flags.append(f'--set=restore_step={error.restore_step}')
    if rate is not None:
      self.flags.append(f'--set=learning_rate={rate:g}')
    self.dropped = ['--set=learning_rate'] if rate is None else []
    self.set_aside = variant_dir if error.restart_workdir else None
    super().__init__(self.line(f'the sweep\'s command with {" ".join(self.flags)}'))

  def line(self, command: str) -> str:
    """The one-line message, with `command` as the way to go on."""
    if self.set_aside:
      command = f'move {self.set_aside} aside, then run {command}'
    return f'{self.summary} {self.advice}: {command}'


def run_sweep(
    sweep: Sweep, workdir: str, only: Optional[Sequence[str]] = None, sets: Sequence[str] = ()
) -> Dict[str, Dict[str, Any]]:
  """Trains the variants not finished yet, then writes the report and figure.

  Variant NAME runs in workdir/NAME; `only` names the variants to run (default:
  all of them) and `sets` are `KEY=VALUE` overrides for every variant, e.g.
  'total_steps=50'. Returns each run variant's eval_results.json, by name.
  Before anything is trained or written, raises a ConfigError for a bad sweep,
  sets or names, a workdir that is not a folder this process can write (or
  make), or a variant directory holding a run of another model. A variant
  that diverges stops the sweep with a VariantDivergedError.
  """
  configs = variant_configs(sweep, sets)
  selected = _selected(sweep, only)
  storage.check_folder(workdir)
  for variant in selected:
    saved = run_folder.RunFolder(os.path.join(workdir, variant.name)).config
    if os.path.exists(saved):  # refused if it is a run of another model
      with open(saved) as f:
        settings = run_config.RunConfig.from_config(configs[variant.name])
        run_config.check_same_model(json.load(f), settings, os.path.dirname(saved))
  os.makedirs(workdir, exist_ok=True)
  finished = {}
  try:
    for number, variant in enumerate(selected, 1):
      variant_dir = os.path.join(workdir, variant.name)
      config = configs[variant.name]
      results = results_of(variant_dir)
      progress = f'Variant {variant.name} ({number}/{len(selected)})'
      if results is not None and results.get('step') == config.total_steps:
        steps = config.total_steps
        training_run.report(f'{progress} finished its {steps} steps before; skipping it.')
      else:
        training_run.report(f'{progress}: {describe(variant.overrides)}')
        try:
          results = trainer.train_and_evaluate(config, variant_dir)
        except divergence.DivergenceError as error:
          own = None  # the sweep file's rate, where a --set of the one that diverged replaced it
          set_keys = [item.partition('=')[0].strip() for item in sets]
          if 'learning_rate' in set_keys and config.learning_rate == error.learning_rate:
            own = variant.overrides.get('learning_rate', sweep.base.learning_rate)
          raise VariantDivergedError(variant.name, variant_dir, error, own) from None
      finished[variant.name] = results
  finally:
    write_report(sweep, workdir)
  return finished


@dataclasses.dataclass(frozen=True)
class SweepSettings:
  """The command's settings, each its flag."""

  sweep: str = setting(help_text='Sweep file, e.g. configs/sweeps/projected_len.py.')
  workdir: str = setting(help_text='Directory of the sweep; variant NAME runs in WORKDIR/NAME.')
  only: Sequence[str] = setting((), 'Comma-separated names of the variants to run (default: all).')
  sets: Sequence[str] = setting(
      (),
      'KEY=VALUE override for every variant, e.g. --set=total_steps=50; repeatable.',
      flag='set',
      repeated=True,
  )


def define_flags() -> None:
  settings_flags.define_flags(SweepSettings)
  cli.local_path_flag(
      'workdir',
      'a sweep writes its report and figure to a local folder: give a local --workdir '
      '(each variant can still be trained alone on gs://)',
  )


def main(_):
  settings = settings_flags.from_flags(SweepSettings)
  storage.location(settings.workdir)  # refuses an empty --workdir
  sweep = load_sweep(settings.sweep)
  try:
    run_sweep(sweep, settings.workdir, only=list(settings.only), sets=list(settings.sets))
  except VariantDivergedError as error:
    command = divergence.command_to_go_on(
        sys.argv[1:],
        error.flags,
        dropped=error.dropped,
        program='linformer_jax.sweep',
        keyed=['--set'],
    )
    raise ConfigError(error.line(command)) from None
  print(report_table(sweep, settings.workdir), flush=True)
  figure = os.path.join(settings.workdir, figure_file(sweep))
  print(f'Report in {os.path.join(settings.workdir, REPORT_FILE)}, figure in {figure}.', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
