"""Tokens per second of our Linformer against the PyTorch `linformer` package.

  python -m linformer_jax.pytorch_comparison --out=/tmp/torch_comparison \
      --seq_lens=512,1024,2048,4096,8192 --projected_len=256 --num_layers=2 \
      --hidden_dim=768 --num_heads=12 --batch=1 --repeats=5

Our model is configured to match lucidrains' `linformer` 0.2.3
(`ComparisonSettings.model_config`) and both are timed at the same size: a
forward pass (ours `models.Encoder` from token ids, including the embeddings)
and a training step (ours `models.MaskedLanguageModel` with `optax.adamw`,
parameters and optimizer state donated). The PyTorch side is
`experiments/pytorch_linformer_baseline.py` (its docstring says what it times),
run by the interpreter of --torch_python, printing one JSON line per (n, mode).
The two sides run one after the other for each n, so a machine whose speed
drifts during the run slows both alike. Setup, the models' differences and
results: docs/benchmarks.md.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import optax

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.analysis import benchmark_settings
from linformer_jax.analysis import measuring
from linformer_jax.analysis import tables
from linformer_jax.analysis.benchmark_budget import ForwardPass
from linformer_jax.analysis.benchmark_settings import VOCAB_SIZE
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import require
from linformer_jax.settings_flags import setting

MODES = ('forward', 'train')
# The integer settings: positive, and passed to the PyTorch script as flags of their names.
INTEGER_SETTINGS = (
    'projected_len',
    'num_layers',
    'hidden_dim',
    'num_heads',
    'batch',
    'repeats',
    'threads',
)
# Each side's measures, the columns jax_* and torch_*.
MEASURES = ('time_ms', 'time_min_ms', 'tokens_per_s')
# The columns of comparison.csv: the cell, each side's measures, their ratio and what ran them.
COLUMNS = (
    *('seq_len', 'projected_len', 'mode', 'batch'),
    *(f'{side}_{measure}' for side in ('jax', 'torch') for measure in MEASURES),
    'ratio',
    *('jax_version', 'jax_device', 'torch_version', 'linformer_version', 'torch_device', 'threads'),
)
# AdamW's learning rate on both sides (the value does not change the work).
LEARNING_RATE = 1e-4
# The PyTorch side, run by the interpreter that has torch and linformer.
TORCH_SCRIPT = (
    pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'pytorch_linformer_baseline.py'
)
# Lines of the PyTorch script's stderr quoted when it fails.
STDERR_TAIL_LINES = 15
# The exit code of a PyTorch baseline that failed while running.
BASELINE_FAILED_EXIT_CODE = 1


@dataclasses.dataclass(frozen=True)
class ComparisonSettings:
  """What to measure, each field a flag of its name; bad values raise a ConfigError naming it."""

  seq_lens: Sequence[int] = setting(
      (512, 1024, 2048, 4096, 8192), 'Sequence lengths n; only n > k run.', minimum=1
  )
  projected_len: int = setting(256, "Linformer's projected length k.", minimum=1)
  num_layers: int = setting(2, 'Encoder layers.', minimum=1)
  hidden_dim: int = setting(768, 'Model width (the MLP is 4 times as wide).', minimum=1)
  num_heads: int = setting(12, 'Attention heads.', minimum=1)
  batch: int = setting(1, 'Sequences per pass or step.', minimum=1)
  repeats: int = setting(5, 'Timed runs per (n, mode), after a warm-up.', minimum=1)
  modes: Sequence[str] = setting(
      MODES, 'forward (inference pass), train (forward, backward, AdamW).', choices=MODES
  )
  threads: int = setting(
      help_text="PyTorch's intra-op threads; default os.cpu_count() "
      '(JAX on CPU uses one per core).',
      default_factory=lambda: os.cpu_count() or 1,
      minimum=1,
  )
  torch_python: str = setting(
      '.venv-torch/bin/python',
      'The Python that has torch and linformer==0.2.3 (`make torch-baseline` makes it).',
  )
  out: Optional[str] = setting(
      None, 'Directory for comparison.md and comparison.csv.', required=True
  )

  def __post_init__(self):
    settings_flags.check(self)
    benchmark_settings.require_heads_divide_width(self)
    require(len(set(self.modes)) == len(self.modes), 'modes', self.modes, 'give each mode once')
    if not self.measured_seq_lens:
      raise ConfigError(
          f'--projected_len={self.projected_len} leaves nothing to measure: it is >= every n '
          f'in --seq_lens={",".join(map(str, self.seq_lens))}; use a k below '
          f'{max(self.seq_lens)}.'
      )

  @property
  def measured_seq_lens(self) -> tuple:
    """The sequence lengths that Linformer compresses: n > k."""
    return tuple(n for n in self.seq_lens if n > self.projected_len)

  @property
  def mlp_dim(self) -> int:
    """The feed-forward width: `linformer`'s fixed 4 * dim."""
    return 4 * self.hidden_dim

  def model_config(self, seq_len: int) -> ModelConfig:
    """Our model shaped as `linformer.Linformer(dim, seq_len, depth, k, heads)`."""
    return benchmark_settings.benchmark_model(
        self,
        max_len=seq_len,
        attention='linformer',
        projected_len=self.projected_len,
        sharing='headwise',
        projection='linear',
        pre_layer_norm=True,
    )


class TorchBaselineError(RuntimeError):
  """The PyTorch script failed or printed something other than its rows."""


def _forward_times(config: ModelConfig, tokens: jax.Array, repeats: int) -> List[float]:
  forward = ForwardPass(config)
  compiled = forward.compile(tokens.shape[0])
  variables = measuring.random_variables(forward.abstract_variables, seed=0)
  return measuring.time_ms(lambda: compiled(variables, tokens), repeats)


def _train_step_times(config: ModelConfig, tokens: jax.Array, repeats: int) -> List[float]:
  optimizer = optax.adamw(LEARNING_RATE)
  compiled, *state = measuring.compiled_mlm_train_step(config, optimizer, tokens, donate=True)

  def step():  # the step donates its inputs: each call takes the previous outputs
    outputs = compiled(*state, tokens)
    state[:] = outputs[:2]
    return outputs

  return measuring.time_ms(step, repeats)


def measure_jax(settings: ComparisonSettings, seq_len: int, mode: str) -> Dict[str, Any]:
  """Times our model at one n in one mode: a row with the PyTorch script's
  fields (seq_len, mode, time_ms (median), time_min_ms, tokens_per_s) and time_max_ms."""
  if mode not in MODES:
    raise ValueError(f'Unknown mode {mode!r}; use one of {MODES}.')
  tokens = measuring.random_tokens((settings.batch, seq_len), VOCAB_SIZE, seed=seq_len)
  measure = _forward_times if mode == 'forward' else _train_step_times
  times = measure(settings.model_config(seq_len), tokens, settings.repeats)
  return {'seq_len': seq_len, 'mode': mode, **measuring.timing(times, tokens.size)}


def check_torch_python(torch_python: str) -> None:
  """Raises a one-line ConfigError if `torch_python` is not an interpreter."""
  if not (os.path.isfile(torch_python) and os.access(torch_python, os.X_OK)):
    raise ConfigError(
        f'--torch_python={torch_python}: no such interpreter. Run `make torch-baseline` in the '
        'repository root to create .venv-torch with torch and linformer==0.2.3, or pass '
        '--torch_python=PATH of a Python that has them.'
    )


def run_torch_baseline(
    settings: ComparisonSettings,
    seq_lens: Sequence[int],
    torch_python: str,
    device: str = 'cpu',
    script: os.PathLike = TORCH_SCRIPT,
) -> List[Dict[str, Any]]:
  """The rows the PyTorch script (tests pass a stand-in) prints at `seq_lens` on
  `device` ('cpu' or 'cuda'), one dict per (n, mode).

  Raises:
    ConfigError: `torch_python` is not an interpreter.
    TorchBaselineError: the script failed (the message quotes its stderr's
      last lines) or did not print a row for every (n, mode).
  """
  check_torch_python(torch_python)
  command = [
      torch_python,
      str(script),
      f'--seq_lens={",".join(map(str, seq_lens))}',
      *(f'--{name}={getattr(settings, name)}' for name in INTEGER_SETTINGS),
      f'--modes={",".join(settings.modes)}',
      f'--device={device}',
  ]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  stderr_tail = '\n'.join(result.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
  if result.returncode:
    raise TorchBaselineError(
        f'The PyTorch baseline {script} failed (exit code {result.returncode}) under '
        f'{torch_python}; the end of its stderr:\n{stderr_tail}'
    )
  rows = []
  for line in result.stdout.splitlines():
    if line.startswith('{'):
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as error:
        raise TorchBaselineError(
            f'The PyTorch baseline {script} printed a line that is not JSON ({error}): {line}'
        ) from None
  missing = {(n, mode) for n in seq_lens for mode in settings.modes} - {
      (row.get('seq_len'), row.get('mode')) for row in rows
  }
  if missing:
    raise TorchBaselineError(
        f'The PyTorch baseline {script} printed no row for (n, mode) {sorted(missing)}; '
        f'the end of its stderr:\n{stderr_tail}'
    )
  return rows


def _ratio(jax_tokens_per_s: float, torch_tokens_per_s: float) -> Optional[float]:
  return jax_tokens_per_s / torch_tokens_per_s if torch_tokens_per_s else None


def compare(
    settings: ComparisonSettings,
    torch_python: str,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    script: os.PathLike = TORCH_SCRIPT,
) -> List[Dict[str, Any]]:
  """Times both sides at every measured n, JAX then PyTorch; one row per (n, mode),
  keyed by COLUMNS, passed to `progress` as it is finished. ratio is JAX tokens/s
  over PyTorch tokens/s; `script` is the PyTorch script (tests pass a stand-in)."""
  check_torch_python(torch_python)
  torch_device = 'cuda' if jax.default_backend() == 'gpu' else 'cpu'
  rows = []
  for seq_len in settings.measured_seq_lens:
    ours = {mode: measure_jax(settings, seq_len, mode) for mode in settings.modes}
    theirs = {
        row['mode']: row
        for row in run_torch_baseline(settings, [seq_len], torch_python, torch_device, script)
    }
    for mode in settings.modes:
      jax_row, torch_row = ours[mode], theirs[mode]
      row = dict(
          seq_len=seq_len,
          projected_len=settings.projected_len,
          mode=mode,
          batch=settings.batch,
          **{f'jax_{measure}': jax_row[measure] for measure in MEASURES},
          **{f'torch_{measure}': torch_row[measure] for measure in MEASURES},
          ratio=_ratio(jax_row['tokens_per_s'], torch_row['tokens_per_s']),
          jax_version=jax.__version__,
          jax_device=measuring.describe_device(),
          torch_version=torch_row.get('torch_version', ''),
          linformer_version=torch_row.get('linformer_version', ''),
          torch_device=torch_row.get('device', torch_device),
          threads=torch_row.get('threads', settings.threads),
      )
      rows.append(row)
      if progress:
        progress(row)
  return rows


def describe_run(settings: ComparisonSettings, rows: Sequence[Dict[str, Any]]) -> str:
  """One line naming the devices, versions and settings, for comparison.md."""
  first = rows[0] if rows else {}
  return (
      f'JAX {first.get("jax_version", jax.__version__)} on {first.get("jax_device", "?")}; '
      f'PyTorch {first.get("torch_version", "?")} with linformer '
      f'{first.get("linformer_version", "?")} on {first.get("torch_device", "?")}, '
      f'{settings.threads} threads. Layers {settings.num_layers}, hidden {settings.hidden_dim}, '
      f'heads {settings.num_heads}, MLP {settings.mlp_dim}, k={settings.projected_len}, '
      f'batch {settings.batch}, float32; median of {settings.repeats} runs after a warm-up. '
      'forward: one encoder pass; train: forward, cross-entropy on every token, backward, '
      'AdamW update. Ratio: JAX tokens/s over PyTorch tokens/s.'
  )


def write_report(rows: Sequence[Dict[str, Any]], out_dir: str, header: str) -> str:
  """Writes comparison.md (the header line and a table n | mode | JAX tokens/s |
  PyTorch tokens/s | ratio) and comparison.csv into `out_dir`; returns the markdown."""
  cells = [
      (
          row['seq_len'],
          row['mode'],
          tables.number_text(row['jax_tokens_per_s'], ',.0f', missing='-'),
          tables.number_text(row['torch_tokens_per_s'], ',.0f', missing='-'),
          '-' if row['ratio'] is None else f'{row["ratio"]:.2f}x',
      )
      for row in rows
  ]
  table = tables.markdown_table(
      ('n', 'mode', 'JAX tokens/s', 'PyTorch tokens/s', 'ratio'), cells, 'rlrrr'
  )
  markdown = f'{header}\n\n{table}\n'
  os.makedirs(out_dir, exist_ok=True)
  storage.write_text(os.path.join(out_dir, 'comparison.md'), markdown)
  tables.write_csv(os.path.join(out_dir, 'comparison.csv'), rows, COLUMNS)
  return markdown


def _print_progress(row: Dict[str, Any]) -> None:
  print(
      f'n={row["seq_len"]} {row["mode"]}: JAX {row["jax_tokens_per_s"]:,.0f} tokens/s, '
      f'PyTorch {row["torch_tokens_per_s"]:,.0f} tokens/s',
      file=sys.stderr,
      flush=True,
  )


def define_flags() -> None:
  settings_flags.define_flags(ComparisonSettings)


def main(_):
  settings = settings_flags.from_flags(ComparisonSettings)
  try:
    rows = compare(settings, settings.torch_python, progress=_print_progress)
  except TorchBaselineError as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(BASELINE_FAILED_EXIT_CODE)
  print(write_report(rows, settings.out, describe_run(settings, rows)))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
