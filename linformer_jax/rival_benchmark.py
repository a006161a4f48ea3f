"""The Long Range Arena's Table 2 (speed and memory) for every registered attention kind.

  python -m linformer_jax.rival_benchmark --seq_lens=1024,2048,4096,8192,16384 \
      --repeats=5 --out=/tmp/rivals.json

Every kind trains the same model, LRA Text's size (4 layers, 256 wide, 4
heads, MLP 1024): the trainer's masked-LM step (`train_steps.train_step`,
logits at the masked 15% of positions, an AdamW update, the state donated) at
each n, batch --batch. A cell is compiled first; one whose arguments +
temporaries (XLA's memory analysis, exact) exceed --memory_budget_gb is
skipped with a note, the others are timed (the median of --repeats steps
after a warm-up). The table gives, per n and kind, training steps/s with the
speed-up over the Transformer ('full') at that n, and the memory with the
Transformer's over it (the saving), as LRA's Table 2 does; below it, each
kind's fitted exponent p of time and memory ~ n^p.

With --target (an accelerator this host compiles for, `analysis/xla_targets`;
`make xla-targets` installs the plugins) nothing runs: the step is compiled for
one device of the target, and the table gives memory and the model's FLOPs per
sequence, and their exponents.

The kinds share LRA's budgets (`LRA_BUDGETS`, each applied where the kind is
registered and declares the setting; --kind_settings overrides them), and
kinds with a sequence projection (Linformer) k = --projected_len. Results and
what they show: docs/benchmarks.md, "Rivals side by side".
"""

import ast
import dataclasses
import functools
import json
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import benchmark_settings
from linformer_jax.analysis import measuring
from linformer_jax.analysis import rival_benchmark_report as report
from linformer_jax.analysis import xla_targets
from linformer_jax.data import masked_lm
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting
from linformer_jax.training import compiled_step
from linformer_jax.training import train_steps
from linformer_jax.units import GIB
from linformer_jax.units import MIB

# LRA's budgets, by kind: the settings of each that LRA's code gives its
# model (Performer's 256 features, Longformer's window of 512 without global
# tokens, BigBird's blocks of 64 with 3 random and 2 global ones, Sparse
# Transformer's fixed pattern of blocks of 128 ending in 32 summary
# positions) and Nystromformer's paper's 64 landmarks. A kind that is not
# registered is not measured; a setting it does not declare is not applied,
# and the table's header says so.
LRA_BUDGETS: Mapping[str, Mapping[str, Any]] = {
    'performer': {'performer_features': 256},
    'nystromformer': {'nystrom_landmarks': 64},
    'longformer': {'longformer_window': 512, 'longformer_global_tokens': 0},
    'bigbird': {'bigbird_block_size': 64, 'bigbird_random_blocks': 3, 'bigbird_global_blocks': 2},
    'sparse_transformer': {
        'sparse_pattern': 'fixed',
        'sparse_block_size': 128,
        'sparse_summary_size': 32,
    },
}
# AdamW, as the trainer and LRA's models train: its two moments are part of
# every cell's memory, the same at every n.
OPTIMIZER = optax.adamw(1e-3, weight_decay=0.01)
MASK_RATE = 0.15  # RoBERTa's share of masked positions, as configs/default.py trains
# The trainer's masked-LM batch (`tasks.MaskedLanguageModelling.batch_shapes`).
BATCH_DTYPES = {
    'inputs': jnp.int32,
    'targets': jnp.int32,
    'weights': jnp.float32,
    'padding_mask': jnp.bool_,
}
# What a row holds, in order (bytes and FLOPs per step; flops: XLA's count of
# the step lowered with the einsum attention).
COLUMNS = (
    'kind',
    'seq_len',
    'batch',
    'attention_kernel',
    'time_ms',
    'steps_per_s',
    'argument_bytes',
    'temp_bytes',
    'memory_bytes',
    'flops',
    'memory_per_sequence',
    'flops_per_sequence',
    'note',
)


def _parse_kind_setting(text: str) -> tuple:
  """'NAME=VALUE' as (name, value text); a ConfigError naming the flag otherwise."""
  name, equals, value = text.partition('=')
  settings_flags.require(
      bool(equals and name), 'kind_settings', text, 'give NAME=VALUE, e.g. performer_features=128'
  )
  return name.strip(), value.strip()


@dataclasses.dataclass(frozen=True)
class RivalBenchmarkSettings(benchmark_settings.model_size_settings(4, 256, 4, 1024, 'LRA Text')):
  """What to measure; each field is the flag of its name (in GiB for bytes), and
  a bad value raises a ConfigError naming the flag."""

  kinds: Sequence[str] = setting(
      (),
      'Attention kinds to measure (registered names); none: every registered kind. '
      "The Transformer ('full') is always measured, first: the ratios are against it.",
  )
  seq_lens: Sequence[int] = setting(
      (1024, 2048, 4096, 8192, 16384), 'Sequence lengths n.', minimum=1
  )
  projected_len: int = setting(
      256, 'k of the kinds with a sequence projection (Linformer); min(k, n) at each n.', minimum=1
  )
  kind_settings: Sequence[str] = setting(
      (),
      "A kind's own setting NAME=VALUE (e.g. performer_features=128), over LRA's budget; "
      'once per setting.',
      repeated=True,
  )
  batch: int = setting(
      1,
      'Sequences per step. LRA timed batch 32 on a TPU v3 4x4 slice (32 cores), about one '
      'sequence per device; 1 is that load, and lets the longest n fit one device.',
      minimum=1,
  )
  dtype: Optional[str] = setting(
      None,
      'Compute dtype; default float32 run on a CPU, bfloat16 on an accelerator or a --target.',
      choices=benchmark_settings.DTYPES,
  )
  repeats: int = setting(5, 'Timed steps per cell, after one warm-up step.', minimum=1)
  memory_budget_bytes: float = setting(
      default_factory=benchmark_settings.default_memory_limit_bytes,
      help_text='Skip cells planning more argument + temporary GiB than this; default 80% '
      'of the device memory JAX may use (of the host RAM on a CPU). Not with --target.',
      flag='memory_budget_gb',
      from_flag=benchmark_settings.memory_limit_of_flag,
  )
  target: Optional[str] = setting(
      None, f'Compile (never run) for one device of this accelerator: {xla_targets.EXAMPLES}.'
  )
  out: Optional[str] = setting(None, 'A JSON file for the rows, exponents and settings.')

  def __post_init__(self):
    settings_flags.check(self)
    benchmark_settings.require_heads_divide_width(self)
    registered = attention_kinds.REGISTRY.names()
    for name in self.kinds:
      settings_flags.require(
          name in attention_kinds.REGISTRY,
          'kinds',
          self.kinds,
          f'{name!r} is not a registered attention kind; use some of {", ".join(registered)}',
      )
    if not self.memory_budget_bytes > 0:
      raise ConfigError('--memory_budget_gb must be positive.')
    self.overrides()  # refuses a bad --kind_settings now, before anything compiles
    if self.target is not None:
      xla_targets.parse_target(self.target)

  @property
  def compute_dtype(self) -> str:
    """--dtype, or its default for where the step runs."""
    if self.dtype:
      return self.dtype
    return 'float32' if self.target is None and jax.default_backend() == 'cpu' else 'bfloat16'

  def measured_kinds(self) -> tuple:
    """The kinds to measure, the Transformer first, then --kinds (or every registered kind)."""
    chosen = self.kinds or attention_kinds.REGISTRY.names()
    return (report.TRANSFORMER,) + tuple(
        dict.fromkeys(k for k in chosen if k != report.TRANSFORMER)
    )

  def overrides(self) -> Dict[str, Any]:
    """--kind_settings as name -> value, each checked against a measured kind's declaration."""
    declared = {
        declaration.name: declaration
        for name in self.measured_kinds()
        for declaration in attention_kinds.kind(name).settings
    }
    values = {}
    for text in self.kind_settings:
      name, value_text = _parse_kind_setting(text)
      settings_flags.require(
          name in declared,
          'kind_settings',
          text,
          f'no measured kind declares {name!r}; '
          f'they declare {", ".join(sorted(declared)) or "none"}',
      )
      declaration = declared[name]
      try:
        value = value_text if declaration.type is str else ast.literal_eval(value_text)
      except (ValueError, SyntaxError):
        value = value_text
      value = declaration.normalised(value)
      settings_flags.require(declaration.allows(value), 'kind_settings', text, declaration.allowed)
      values[name] = value
    return values


def kind_settings(settings: RivalBenchmarkSettings, name: str) -> Dict[str, Any]:
  """The kind's own settings in this benchmark: its declared defaults, then
  LRA's budget, then --kind_settings, each where the kind declares it."""
  declared = {declaration.name: declaration for declaration in attention_kinds.kind(name).settings}
  values = {key: declaration.default for key, declaration in declared.items()}
  for source in (LRA_BUDGETS.get(name, {}), settings.overrides()):
    values.update({key: value for key, value in source.items() if key in declared})
  return values


def unapplied_budgets(kinds: Sequence[str]) -> List[str]:
  """'kind.setting' of each LRA budget a measured kind does not declare."""
  return [
      f'{name}.{key}'
      for name in kinds
      for key in LRA_BUDGETS.get(name, {})
      if key not in {declaration.name for declaration in attention_kinds.kind(name).settings}
  ]


def model_config(
    settings: RivalBenchmarkSettings, name: str, seq_len: int, platform: str
) -> ModelConfig:
  """The model of one cell: LRA Text's sizes, attention `name` with its settings.

  One sequence projection per layer (sharing='headwise'), as configs/lra_text.py
  trains it, initialised 'jl' so that every k suits every n (the benchmark draws
  its own random values); the attention kernel is what 'auto' takes on devices
  of `platform`.
  """
  config = benchmark_settings.benchmark_model(
      settings,
      max_len=seq_len,
      attention=name,
      projected_len=min(settings.projected_len, seq_len),
      sharing='headwise',
      projection='linear',
      projection_init='jl',
      dtype=settings.compute_dtype,
      extension_settings=kind_settings(settings, name),
  )
  return config.with_kernel_for(platform)[0]


def abstract_step(
    config: ModelConfig, batch: int, sharding: Optional[Any] = None
) -> Tuple[Any, Any]:
  """The trainer's masked-LM step for `config` and its inputs' shapes.

  The step is `train_steps.train_step` (forward, masked-token cross-entropy,
  backward, an AdamW update, the finite check; the state donated) with the
  trainer's masked-LM loss, which computes logits at the masked positions
  only. Returns the jitted step and its abstract (state, batch, dropout key),
  carrying `sharding` where one is given.
  """
  model = models.MaskedLanguageModel(config)
  tokens = jax.ShapeDtypeStruct((batch, config.max_len), jnp.int32)
  variables = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens))
  params = variables.pop('params')
  state = train_steps.TrainState(
      step=jax.ShapeDtypeStruct((), jnp.int32),
      params=params,
      opt_state=jax.eval_shape(OPTIMIZER.init, params),
      constants=variables,
  )
  batch_shapes = {
      name: jax.ShapeDtypeStruct(tokens.shape, dtype) for name, dtype in BATCH_DTYPES.items()
  }
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  inputs = (state, batch_shapes, key)
  if sharding is not None:
    inputs = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), inputs
    )
  loss_sums = train_steps.masked_lm_loss(
      model, masked_lm.max_predictions(config.max_len, MASK_RATE)
  )
  step = functools.partial(train_steps.train_step, loss_sums=loss_sums, optimizer=OPTIMIZER)
  return jax.jit(step, donate_argnums=0), inputs


def random_inputs(abstract_inputs: Any, vocab_size: int, seed: int) -> Any:
  """A state of random parameters and constants, a batch of random tokens with
  max_predictions masked positions per row, and a dropout key; drawn on the host."""
  state, batch_shapes, _ = abstract_inputs
  params = measuring.random_variables(state.params, seed)
  state = train_steps.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=OPTIMIZER.init(params),
      constants=measuring.random_variables(state.constants, seed + 1),
  )
  rows, length = batch_shapes['inputs'].shape
  rng = np.random.default_rng(seed)
  weights = np.zeros((rows, length), np.float32)
  for row in weights:
    row[rng.permutation(length)[: masked_lm.max_predictions(length, MASK_RATE)]] = 1.0
  batch = {
      'inputs': measuring.random_tokens((rows, length), vocab_size, seed),
      'targets': measuring.random_tokens((rows, length), vocab_size, seed + 1),
      'weights': jnp.asarray(weights),
      'padding_mask': jnp.ones((rows, length), jnp.bool_),
  }
  return state, batch, jax.random.PRNGKey(seed)


def model_flops(config: ModelConfig, batch: int) -> Optional[float]:
  """FLOPs of one step as the model defines it: XLA's cost analysis of the step
  lowered for this host with the einsum attention (a fused kernel does the same
  products, but is opaque to the analysis)."""
  einsum = dataclasses.replace(config, attention_kernel='einsum', kernel_partition=None)
  step, inputs = abstract_step(einsum, batch)
  return compiled_step.cost_analysis(step.lower(*inputs))['flops']


def _new_row(settings: RivalBenchmarkSettings, name: str, seq_len: int) -> Dict[str, Any]:
  row: Dict[str, Any] = dict.fromkeys(COLUMNS)
  row.update(kind=name, seq_len=seq_len, batch=settings.batch, note='')
  return row


def _planned(row: Dict[str, Any], compiled: Any) -> None:
  planned = compiled_step.planned_bytes(compiled)
  row.update(
      argument_bytes=planned['argument_bytes'],
      temp_bytes=planned['temp_bytes'],
      memory_bytes=planned['argument_bytes'] + planned['temp_bytes'],
  )


def measure_cell(settings: RivalBenchmarkSettings, name: str, seq_len: int) -> Dict[str, Any]:
  """One (kind, n) on this host: compiled memory and FLOPs, then steps/s if it
  fits the budget. Fields that were not measured are None and `note` says why."""
  row = _new_row(settings, name, seq_len)
  try:
    config = model_config(settings, name, seq_len, jax.default_backend())
    row['attention_kernel'] = config.attention_kernel
    step, abstract_inputs = abstract_step(config, settings.batch)
    lowered = step.lower(*abstract_inputs)
    if config.attention_kernel in compiled_step.OPAQUE_KERNELS:
      row['flops'] = model_flops(config, settings.batch)
    else:
      row['flops'] = compiled_step.cost_analysis(lowered)['flops']
    compiled = lowered.compile()
    _planned(row, compiled)
    if row['memory_bytes'] > settings.memory_budget_bytes:
      planned = {'temp_bytes': row['temp_bytes'], 'argument_bytes': row['argument_bytes']}
      row['note'] = measuring.over_limit_note('cell', planned, settings.memory_budget_bytes)
      return row
    state, batch, key = random_inputs(abstract_inputs, config.vocab_size, seed=seq_len)
    held = [state]  # the step donates its state: each call takes the last one's

    def call():
      held[0], metrics = compiled(held[0], batch, key)
      return metrics['loss']

    times = measuring.time_ms(call, settings.repeats)
  except ConfigError as error:  # a kind that cannot take this n with its settings
    row['note'] = f'not measured: {error}'
    return row
  except Exception as error:  # pylint: disable=broad-except
    row['note'] = f'cell skipped: {measuring.out_of_memory(error)}'
    return row
  row['time_ms'] = measuring.timing(times, settings.batch * seq_len)['time_ms']
  row['steps_per_s'] = 1e3 / row['time_ms']
  return row


def compile_cell(
    settings: RivalBenchmarkSettings, name: str, seq_len: int, device: Any, usable_bytes: int
) -> Dict[str, Any]:
  """One (kind, n) compiled, never run, for one device of a target: its
  memory (XLA's, or what XLA said a refused step needs) and the model's FLOPs."""
  row = _new_row(settings, name, seq_len)
  try:
    config = model_config(settings, name, seq_len, device.platform)
    row['attention_kernel'] = config.attention_kernel
    mesh = jax.sharding.Mesh(np.array([device]), ('data',))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step, abstract_inputs = abstract_step(config, settings.batch, sharding)
    row['flops'] = model_flops(config, settings.batch)
    try:
      _planned(row, step.lower(*abstract_inputs).compile())
    except jax.errors.JaxRuntimeError as error:
      need = compiled_step.out_of_memory_need(error)
      if need is None:
        raise
      row.update(argument_bytes=need[0], temp_bytes=need[1], memory_bytes=sum(need))
      row['note'] = f'refused by XLA: needs {sum(need) / GIB:.2f} GiB'
      return row
  except ConfigError as error:
    row['note'] = f'not measured: {error}'
    return row
  if row['memory_bytes'] > usable_bytes:
    row['note'] = (
        f'does not fit: {row["memory_bytes"] / GIB:.2f} GiB > {usable_bytes / GIB:.2f} GiB'
    )
  return row


def run(
    settings: RivalBenchmarkSettings,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    cell: Optional[Callable[[str, int], Dict[str, Any]]] = None,
) -> List[Dict[str, Any]]:
  """Measures every kind at every n (`cell(kind, n)`, by default `measure_cell`),
  adding memory and FLOPs per sequence; one row per (kind, n), by n then kind."""
  cell = cell or functools.partial(measure_cell, settings)
  rows = []
  for seq_len in settings.seq_lens:
    for name in settings.measured_kinds():
      rows.append(cell(name, seq_len))
      for field in ('memory', 'flops'):
        total = rows[-1]['memory_bytes' if field == 'memory' else 'flops']
        if total is not None:
          rows[-1][f'{field}_per_sequence'] = total / settings.batch
      if progress:
        progress(rows[-1])
  return rows


def _settings_text(settings: RivalBenchmarkSettings, kinds: Sequence[str]) -> str:
  """'linformer k=256; performer performer_features=256; ...': each kind's budget."""
  parts = []
  for name in kinds:
    values = [f'k={settings.projected_len}'] if attention_kinds.kind(name).uses_projection else []
    values += [f'{key}={value}' for key, value in kind_settings(settings, name).items()]
    if values:
      parts.append(f'{name} {" ".join(values)}')
  return '; '.join(parts)


def describe_run(settings: RivalBenchmarkSettings, place: Optional[str] = None) -> str:
  """Lines naming where it ran (`place`; by default this host's device), the
  model, the step and each kind's budget, above the table."""
  kinds = settings.measured_kinds()
  if settings.target is None:
    place = place or f'Device: {measuring.describe_device()}'
    how = (
        f'median of {settings.repeats} steps after a warm-up; memory: arguments + '
        f'temporaries (XLA), budget {settings.memory_budget_bytes / GIB:.1f} GiB'
    )
    brackets = "steps/s over the Transformer's, and the Transformer's memory over the kind's"
  else:
    how = (
        "compiled, not run; memory: arguments + temporaries (XLA's), per sequence; FLOPs: "
        "XLA's count of the step with the einsum attention, per sequence"
    )
    brackets = "the Transformer's memory and FLOPs over the kind's"
  lines = [
      f'{place}; {settings.num_layers} layers, hidden {settings.hidden_dim}, '
      f'{settings.num_heads} heads, MLP {settings.mlp_dim}, batch {settings.batch}, '
      f'{settings.compute_dtype}; a masked-LM train step (forward, backward, AdamW); {how}.',
      f'Budgets: {_settings_text(settings, kinds) or "none"}.',
      f'In brackets: {brackets}, at the same n.',
  ]
  unapplied = unapplied_budgets(kinds)
  if unapplied:
    lines.append(f'LRA budgets not applied (the kind declares no such setting): {unapplied}.')
  return '\n'.join(lines)


def write_json(
    path: str, settings: RivalBenchmarkSettings, rows: List[Dict[str, Any]], fitted: Dict
) -> None:
  """The settings, the rows and the exponents as one JSON object."""
  kinds = settings.measured_kinds()
  described = {field.name: getattr(settings, field.name) for field in dataclasses.fields(settings)}
  described.update(
      dtype=settings.compute_dtype,
      measured_kinds=list(kinds),
      kind_budgets={name: kind_settings(settings, name) for name in kinds},
  )
  with open(path, 'w') as f:
    json.dump({'settings': described, 'rows': rows, 'exponents': fitted}, f, indent=1)
    f.write('\n')


def _print_progress(row: Dict[str, Any]) -> None:
  result = row['note']
  if row['time_ms'] is not None:
    result = f"{row['time_ms']:.1f} ms, {row['memory_bytes'] / MIB:,.1f} MiB"
  elif row['memory_bytes'] is not None and not result:
    result = f"{row['memory_bytes'] / MIB:,.1f} MiB"
  print(f"{row['kind']} n={row['seq_len']}: {result}", file=sys.stderr, flush=True)


def _on_target(settings: RivalBenchmarkSettings) -> Tuple[Callable[..., Dict[str, Any]], str]:
  """The cell function compiling for one device of --target, and the line naming it."""
  xla_targets.enable_plugins('linformer_jax.rival_benchmark')
  target = xla_targets.parse_target(settings.target)
  devices = xla_targets.target_devices(target)
  usable = target.usable_bytes_per_device(xla_targets.devices_per_chip(devices))
  place = (
      f'Target: {target.name}, one device: {devices[0].device_kind}, usable '
      f'{usable / GIB:.2f} GiB ({target.memory_note()})'
  )
  cell = functools.partial(compile_cell, settings, device=devices[0], usable_bytes=usable)
  return cell, place


def define_flags() -> None:
  settings_flags.define_flags(RivalBenchmarkSettings)


def main(_):
  settings = settings_flags.from_flags(RivalBenchmarkSettings)
  cell, place, quantities, fields = None, None, report.RUN_QUANTITIES, report.RUN_FITS
  if settings.target is not None:
    cell, place = _on_target(settings)
    quantities, fields = report.TARGET_QUANTITIES, report.TARGET_FITS
  rows = run(settings, progress=_print_progress, cell=cell)
  fitted = report.exponents(rows, fields)
  print(describe_run(settings, place))
  print(report.kernels_text(rows))
  print()
  print(report.format_table(rows, quantities))
  print()
  print(report.format_exponents(fitted, fields))
  for line in report.notes(rows):
    print(f'- {line}')
  if settings.out:
    with cli.saving_printed_results(settings.out):
      write_json(settings.out, settings, rows, fitted)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
