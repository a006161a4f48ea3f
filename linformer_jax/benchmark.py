"""Inference time and memory of the whole model: Linformer against the Transformer.

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3

Against the memory-efficient Transformer too (queries and MLP 512 positions
at a time, jax.nn.dot_product_attention's XLA kernel), and with the paper's
method: every cell at the largest batch whose compiled memory fits 16 GiB (a
budget the machine can run: at most --memory_limit_gb / 1.5, as a budget run
peaks at about 1.5 times its budget):

  python -m linformer_jax.benchmark --out=/tmp/bench_out \
      --seq_lens=512,1024,2048,4096 --projected_lens=128,256 --repeats=3 \
      --inference_chunk=512 --attention_kernel=xla --memory_budget_gb=16

It writes results.csv, table.md (speed-up / memory saving per n and k against
each Transformer, also printed) and time_per_token.png, memory.png into
--out; its settings (and flags) are `benchmark_settings.BenchmarkSettings`.
Bad flags end with a one-line error and exit code 2.

The Linformer paper's Table 3: the encoder (12 layers, 768 wide, 12 heads, MLP
3072 by default; Linformer with one linear projection shared by every layer)
runs a forward pass under `jax.jit` at every sequence length n, the Transformer
once per n and Linformer once per projected length k < n. The Transformer is
the paper's baseline: one pass, this codebase's einsum attention. With
--inference_chunk > 0 or --attention_kernel other than einsum, every n also
gets the memory-efficient Transformer a user would pick ('transformer-
efficient'): queries and MLP --inference_chunk positions at a time and/or
jax.nn.dot_product_attention's XLA or cuDNN kernel. Linformer cells run with
--inference_chunk too (it shrinks their MLP's temporaries) and einsum
attention. Each cell records

  batch         --batch sequences, or with --memory_budget_gb the paper's
                method: the largest batch (at most --max_batch) whose compiled
                temporary + argument + output bytes fit the budget, found by
                compiling only (doubling, then bisection), and recorded as
                budget_batch, with bytes_per_sequence: those bytes less the
                parameters', over the batch;
  time          median, min and max of --repeats runs after a warm-up;
  memory        XLA's compiled memory analysis (temporary, argument and output
                bytes, exact and repeatable) and, on GPU, the device's peak
                bytes in use so far in the process (JAX has no reset, so it
                bounds a cell's own peak only where it rises above earlier
                cells');
  throughput    tokens per second and microseconds per token (flat in n for a
                model linear in n);
  utilisation   XLA's FLOP count per second over the matrix-multiply rate of a
                square `jnp.dot`s timed in the same process (the best of
                --matmul_sizes: the rate the hardware reaches); a chunked
                pass counts the FLOPs of its one-pass compile, as XLA counts
                a loop's body once;
  training      with --train_throughput, tokens per second of an MLM
                forward + backward + SGD step.

The matmul rate is measured in the benchmark's dtype (float32 by default).

At a fixed batch, a cell whose compiled temporary + argument bytes exceed
--memory_limit_gb is skipped with a note; with a budget, so is a cell whose
batch 1 does not fit it. A cell whose compile or run runs out of memory is
skipped with a note too. Writes results.csv, table.md (speed-up / memory
saving per n and k against each Transformer, also printed) and
time_per_token.png, memory.png into --out.
"""

import dataclasses
import functools
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis.benchmark_budget import ForwardPass
from linformer_jax.analysis.benchmark_budget import compile_within_budget
from linformer_jax.analysis.benchmark_report import EFFICIENT_TRANSFORMER
from linformer_jax.analysis.benchmark_report import LINFORMER
from linformer_jax.analysis.benchmark_report import TRANSFORMER
from linformer_jax.analysis.benchmark_settings import VOCAB_SIZE
from linformer_jax.analysis.benchmark_settings import BenchmarkSettings
from linformer_jax.analysis.benchmark_settings import memory_stats
from linformer_jax.analysis.measuring import describe_device
from linformer_jax.analysis.measuring import first_line
from linformer_jax.analysis.measuring import mlm_train_step
from linformer_jax.analysis.measuring import over_limit_note
from linformer_jax.analysis.measuring import random_variables
from linformer_jax.analysis.measuring import time_ms
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training.compiled_step import is_out_of_memory
from linformer_jax.training.compiled_step import planned_bytes
from linformer_jax.units import GIB


def measure_matmul_gflops(
    sizes: Sequence[int] = (1024, 2048, 4096), repeats: int = 5, dtype: str = 'float32'
) -> float:
  """The machine's matrix-multiply rate in GFLOP/s: the best of square `jnp.dot`s.

  Each [size, size] product is timed `repeats` times after a warm-up and the
  fastest run of the fastest size counts, so the rate approximates what the
  hardware can reach rather than a typical call (a single median of one size
  sits below it, which would put the model's utilisation above 100%).
  """
  best = 0.0
  keys = jax.random.split(jax.random.PRNGKey(0))
  matmul = jax.jit(jnp.dot)
  for size in sizes:
    a, b = (jax.random.normal(key, (size, size), jnp.dtype(dtype)) for key in keys)
    fastest_ms = min(time_ms(lambda: matmul(a, b), repeats))  # pylint: disable=cell-var-from-loop
    best = max(best, 2 * size**3 / (fastest_ms * 1e-3) / 1e9)
  return best


def _train_tokens_per_s(
    config: ModelConfig, tokens: jax.Array, settings: BenchmarkSettings
) -> Dict[str, Any]:
  """Tokens per second of a training step, or a note saying why it was skipped."""
  # One pass, as in training: the step is deterministic only to drop dropout,
  # which would otherwise turn on the inference chunks.
  model = models.MaskedLanguageModel(dataclasses.replace(config, inference_chunk=0))
  optimizer = optax.sgd(1e-3)
  try:
    params = random_variables(
        jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)['params'], seed=1
    )
    opt_state = optimizer.init(params)
    compiled = (
        jax.jit(functools.partial(mlm_train_step, model, optimizer))
        .lower(params, opt_state, tokens)
        .compile()
    )
    planned = planned_bytes(compiled)
    if planned['temp_bytes'] + planned['argument_bytes'] > settings.memory_limit_bytes:
      return {'note': over_limit_note('train step', planned, settings.memory_limit_bytes)}
    times = time_ms(lambda: compiled(params, opt_state, tokens), settings.repeats)
  except Exception as error:  # pylint: disable=broad-except
    if not is_out_of_memory(error):
      raise
    return {'note': f'train step out of memory: {first_line(error)}'}
  return {'train_tokens_per_s': tokens.size / (statistics.median(times) * 1e-3)}


def _add_note(row: Dict[str, Any], note: str) -> None:
  row['note'] = '; '.join(part for part in (row['note'], note) if part)


def benchmark_cell(
    settings: BenchmarkSettings,
    model: str,
    seq_len: int,
    projected_len: Optional[int] = None,
    matmul_gflops: Optional[float] = None,
) -> Dict[str, Any]:
  """Measures one model at one n (and k).

  Args:
    settings: the model dimensions, batch or memory budget, repeats and
      memory limit.
    model: TRANSFORMER, EFFICIENT_TRANSFORMER or LINFORMER (see
      `BenchmarkSettings.model_config`).
    seq_len: the sequence length n.
    projected_len: Linformer's k; None for the Transformers.
    matmul_gflops: the machine's matrix-multiply rate, for `utilisation`.

  Returns:
    The row, keyed by benchmark_report.COLUMNS; fields that were not
    measured are None and `note` says why.
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
    forward = ForwardPass(config)
    if settings.memory_budget_bytes is None:
      compiled = forward.compile(settings.batch)
      row.update(planned_bytes(compiled))
      row.update(forward.cost(compiled, settings.batch))
      if row['temp_bytes'] + row['argument_bytes'] > settings.memory_limit_bytes:
        row['note'] = over_limit_note('cell', row, settings.memory_limit_bytes)
        return row
    else:
      compiled, found = compile_within_budget(
          forward, settings.memory_budget_bytes, settings.max_batch
      )
      row.update(found)
      if compiled is None:
        return row
      row.update(forward.cost(compiled, row['batch']))
    tokens_shape = forward.tokens_shape(row['batch'])
    tokens = jnp.asarray(
        np.random.default_rng(seq_len).integers(0, VOCAB_SIZE, tokens_shape.shape, np.int32)
    )
    variables = random_variables(forward.abstract_variables, seed=0)
    times = time_ms(lambda: compiled(variables, tokens), settings.repeats)
  except Exception as error:  # pylint: disable=broad-except
    if not is_out_of_memory(error):
      raise
    _add_note(row, f'cell skipped: out of memory: {first_line(error)}')
    return row
  stats = memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    row['peak_bytes'] = int(stats['peak_bytes_in_use'])
  median_ms = statistics.median(times)
  num_tokens = tokens.size
  row.update(
      time_ms=median_ms,
      time_min_ms=min(times),
      time_max_ms=max(times),
      tokens_per_s=num_tokens / (median_ms * 1e-3),
      us_per_token=median_ms * 1e3 / num_tokens,
  )
  if row['flops'] is not None and matmul_gflops:
    row['utilisation'] = row['flops'] / (median_ms * 1e-3) / (matmul_gflops * 1e9)
  if settings.train_throughput:
    del variables
    train = _train_tokens_per_s(config, tokens, settings)
    row['train_tokens_per_s'] = train.get('train_tokens_per_s')
    _add_note(row, train.get('note', ''))
  return row


def grid_cells(settings: BenchmarkSettings):
  """(model, n, k) of every cell: per n the Transformer, the efficient one if asked, each k < n."""
  for seq_len in settings.seq_lens:
    yield TRANSFORMER, seq_len, None
    if settings.has_efficient_transformer:
      yield EFFICIENT_TRANSFORMER, seq_len, None
    for projected_len in settings.projected_lens:
      if projected_len < seq_len:
        yield LINFORMER, seq_len, projected_len


def run_grid(
    settings: BenchmarkSettings,
    matmul_gflops: float,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> List[Dict[str, Any]]:
  """Measures every cell of the grid; returns one row per (model, n, k)."""
  rows = []
  for model, seq_len, projected_len in grid_cells(settings):
    row = benchmark_cell(settings, model, seq_len, projected_len, matmul_gflops)
    rows.append(row)
    if progress:
      progress(row)
  return rows


def describe_run(settings: BenchmarkSettings) -> str:
  """One line naming the device and the settings, for the top of table.md."""
  if settings.memory_budget_bytes is None:
    batch = f'batch {settings.batch}'
  else:
    batch = (
        f'the largest batch (at most {settings.max_batch}) within '
        f'{settings.memory_budget_bytes / GIB:g} GiB'
    )
  execution = ''
  if settings.inference_chunk:
    execution += f'inference chunk {settings.inference_chunk} (Linformer, efficient Transformer), '
  if settings.attention_kernel != 'einsum':
    execution += f'attention kernel {settings.attention_kernel} (efficient Transformer), '
  return (
      f'Device: {describe_device()}; '
      f'{settings.num_layers} layers, hidden {settings.hidden_dim}, '
      f'{settings.num_heads} heads, MLP {settings.mlp_dim}, '
      f'{batch}, {execution}{settings.dtype}, forward pass, median of '
      f'{settings.repeats} runs.'
  )


def _print_progress(row: Dict[str, Any]) -> None:
  if row['time_ms'] is None:
    result = row['note']
  else:
    result = f"{row['time_ms']:.1f} ms at batch {row['batch']}"
  print(f'{benchmark_report.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def define_flags() -> None:
  """The command's flags: defined when it runs, so that importing it defines none."""
  settings_flags.define_flags(BenchmarkSettings)


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --FLAG=VALUE (see --help)')
  settings = settings_flags.from_flags(BenchmarkSettings)
  matmul_gflops = measure_matmul_gflops(settings.matmul_sizes, dtype=settings.dtype)
  rows = run_grid(settings, matmul_gflops, progress=_print_progress)
  print(
      benchmark_report.write_outputs(
          rows, settings.out, matmul_gflops, describe_run(settings), settings.memory_budget_bytes
      )
  )


if __name__ == '__main__':
  define_flags()
  cli.run(main)
