"""Inference time and memory of the whole model: Linformer against the Transformer.

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3

Against the memory-efficient Transformer too, and with the paper's method
(every cell at the largest batch whose compiled memory fits 16 GiB):

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3 \
      --inference_chunk=512 --attention_kernel=xla --memory_budget_gb=16

It writes results.csv, table.md (also printed), time_per_token.png and
memory.png into --out; the flags are the fields of
`benchmark_settings.BenchmarkSettings`. docs/benchmarks.md describes the
models, what each cell records and the two modes. Beyond it: the matmul rate
is measured in the benchmark's dtype; the training step is an MLM forward,
backward and SGD update; peak_bytes (GPU) is the process's peak so far, as JAX
has no reset, so it bounds a cell's own peak only where it rises above earlier
cells'; and a cell that runs out of memory compiling or running, or whose
batch 1 does not fit the budget, is skipped with a note.
"""

import dataclasses
import functools
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import optax

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import benchmark_budget
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis import benchmark_settings
from linformer_jax.analysis import measuring
from linformer_jax.analysis.benchmark_settings import BenchmarkSettings
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import compiled_step
from linformer_jax.units import GIB


def measure_matmul_gflops(
    sizes: Sequence[int] = (1024, 2048, 4096), repeats: int = 5, dtype: str = 'float32'
) -> float:
  """The machine's matrix-multiply rate in GFLOP/s: the best of square `jnp.dot`s.

  The fastest of `repeats` runs of the fastest size counts: what the hardware
  can reach (a median sits below it, putting utilisation above 100%).
  """
  best = 0.0
  keys = jax.random.split(jax.random.PRNGKey(0))
  matmul = jax.jit(jnp.dot)
  for size in sizes:
    a, b = (jax.random.normal(key, (size, size), jnp.dtype(dtype)) for key in keys)
    fastest_ms = min(measuring.time_ms(functools.partial(matmul, a, b), repeats))
    best = max(best, 2 * size**3 / (fastest_ms * 1e-3) / 1e9)
  return best


def _train_tokens_per_s(
    config: ModelConfig, tokens: jax.Array, settings: BenchmarkSettings
) -> Tuple[Optional[float], str]:
  """Tokens per second of a training step, or None and a note saying why it was skipped."""
  # One pass, as in training: the step is deterministic only to drop dropout,
  # which would otherwise turn on the inference chunks.
  config = dataclasses.replace(config, inference_chunk=0)
  try:
    compiled, params, opt_state = measuring.compiled_mlm_train_step(config, optax.sgd(1e-3), tokens)
    planned = compiled_step.planned_bytes(compiled)
    if benchmark_report.memory_bytes(planned) > settings.memory_limit_bytes:
      return None, measuring.over_limit_note('train step', planned, settings.memory_limit_bytes)
    times = measuring.time_ms(lambda: compiled(params, opt_state, tokens), settings.repeats)
  except Exception as error:  # pylint: disable=broad-except
    return None, f'train step {measuring.out_of_memory(error)}'
  return measuring.timing(times, tokens.size)['tokens_per_s'], ''


def _add_note(row: Dict[str, Any], note: str) -> None:
  row['note'] = '; '.join(part for part in (row['note'], note) if part)


def benchmark_cell(
    settings: BenchmarkSettings,
    model: str,
    seq_len: int,
    projected_len: Optional[int] = None,
    matmul_gflops: Optional[float] = None,
) -> Dict[str, Any]:
  """Measures `model` (see `BenchmarkSettings.model_config`) at n and, for Linformer, k.

  Returns the row, keyed by benchmark_report.COLUMNS; fields that were not
  measured are None and `note` says why. `matmul_gflops` gives `utilisation`.
  """
  config = settings.model_config(model, seq_len, projected_len)
  row: Dict[str, Any] = dict.fromkeys(benchmark_report.COLUMNS)
  row.update(
      model=model,
      seq_len=seq_len,
      projected_len=projected_len or 0,
      batch=settings.batch,
      note='',
      inference_chunk=config.inference_chunk,
      attention_kernel=config.attention_kernel,
  )
  try:
    forward = benchmark_budget.ForwardPass(config)
    if settings.memory_budget_bytes is None:
      compiled = forward.compile(settings.batch)
      row.update(compiled_step.planned_bytes(compiled))
      row.update(forward.cost(compiled, settings.batch))
      if benchmark_report.memory_bytes(row) > settings.memory_limit_bytes:
        row['note'] = measuring.over_limit_note('cell', row, settings.memory_limit_bytes)
        return row
    else:
      compiled, found = benchmark_budget.compile_within_budget(
          forward, settings.memory_budget_bytes, settings.max_batch
      )
      row.update(found)
      if compiled is None:
        return row
      row.update(forward.cost(compiled, row['batch']))
    shape = forward.tokens_shape(row['batch']).shape
    tokens = measuring.random_tokens(shape, benchmark_settings.VOCAB_SIZE, seed=seq_len)
    variables = measuring.random_variables(forward.abstract_variables, seed=0)
    times = measuring.time_ms(lambda: compiled(variables, tokens), settings.repeats)
  except Exception as error:  # pylint: disable=broad-except
    _add_note(row, f'cell skipped: {measuring.out_of_memory(error)}')
    return row
  row['peak_bytes'] = compiled_step.peak_device_bytes()
  row.update(measuring.timing(times, tokens.size))
  row['us_per_token'] = row['time_ms'] * 1e3 / tokens.size
  if row['flops'] is not None and matmul_gflops:
    row['utilisation'] = row['flops'] / (row['time_ms'] * 1e-3) / (matmul_gflops * 1e9)
  if settings.train_throughput:
    del variables
    row['train_tokens_per_s'], note = _train_tokens_per_s(config, tokens, settings)
    _add_note(row, note)
  return row


def grid_cells(settings: BenchmarkSettings):
  """(model, n, k) of every cell: per n the Transformer, the efficient one if asked, each k < n."""
  for seq_len in settings.seq_lens:
    yield benchmark_report.TRANSFORMER, seq_len, None
    if settings.has_efficient_transformer:
      yield benchmark_report.EFFICIENT_TRANSFORMER, seq_len, None
    for projected_len in settings.projected_lens:
      if projected_len < seq_len:
        yield benchmark_report.LINFORMER, seq_len, projected_len


def run_grid(
    settings: BenchmarkSettings,
    matmul_gflops: float,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> List[Dict[str, Any]]:
  """Measures every cell of the grid; returns one row per (model, n, k)."""
  rows = []
  for model, seq_len, projected_len in grid_cells(settings):
    rows.append(benchmark_cell(settings, model, seq_len, projected_len, matmul_gflops))
    if progress:
      progress(rows[-1])
  return rows


def describe_run(settings: BenchmarkSettings) -> str:
  """One line naming the device and the settings, for the top of table.md."""
  batch = f'batch {settings.batch}'
  if settings.memory_budget_bytes is not None:
    budget = settings.memory_budget_bytes / GIB
    batch = f'the largest batch (at most {settings.max_batch}) within {budget:g} GiB'
  execution = ''
  if settings.inference_chunk:
    execution += f'inference chunk {settings.inference_chunk} (Linformer, efficient Transformer), '
  if settings.attention_kernel != 'einsum':
    execution += f'attention kernel {settings.attention_kernel} (efficient Transformer), '
  return (
      f'Device: {measuring.describe_device()}; {settings.num_layers} layers, hidden '
      f'{settings.hidden_dim}, {settings.num_heads} heads, MLP {settings.mlp_dim}, {batch}, '
      f'{execution}{settings.dtype}, forward pass, median of {settings.repeats} runs.'
  )


def _print_progress(row: Dict[str, Any]) -> None:
  result = row['note']
  if row['time_ms'] is not None:
    result = f"{row['time_ms']:.1f} ms at batch {row['batch']}"
  print(f'{benchmark_report.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def define_flags() -> None:
  settings_flags.define_flags(BenchmarkSettings)


def main(_):
  settings = settings_flags.from_flags(BenchmarkSettings)
  matmul_gflops = measure_matmul_gflops(settings.matmul_sizes, dtype=settings.dtype)
  rows = run_grid(settings, matmul_gflops, progress=_print_progress)
  header, budget = describe_run(settings), settings.memory_budget_bytes
  print(benchmark_report.write_outputs(rows, settings.out, matmul_gflops, header, budget))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
