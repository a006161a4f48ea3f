"""Inference time and memory of the whole model: Linformer against the Transformer.

The library of `python -m linformer_jax.benchmark`.

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
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis import flag_checks
from linformer_jax.analysis.benchmark_budget import ForwardPass
from linformer_jax.analysis.benchmark_budget import compile_within_budget
from linformer_jax.analysis.benchmark_budget import cost_analysis  # noqa: F401 (causal_benchmark)
from linformer_jax.analysis.benchmark_budget import is_out_of_memory
from linformer_jax.analysis.benchmark_budget import planned_bytes
from linformer_jax.analysis.benchmark_report import EFFICIENT_TRANSFORMER
from linformer_jax.analysis.benchmark_report import LINFORMER
from linformer_jax.analysis.benchmark_report import TRANSFORMER
from linformer_jax.analysis.settings_flags import setting
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.model.attention import ATTENTION_KERNELS
from linformer_jax.model.model_config import ModelConfig

# Small enough that the embedding and its lookup do not dominate the encoder.
VOCAB_SIZE = 1000
DTYPES = ('float32', 'bfloat16')
# Share of the device's (or host's) memory a cell may plan to use by default.
DEFAULT_MEMORY_FRACTION = 0.8
# A budget run's peak resident memory over its budget: 12.0 GiB at 8 GiB on
# XLA:CPU (the process, the runtime, the inputs and outputs beside the compiled
# bytes, allocator caching), docs/benchmarks.md "XLA:CPU's library fusions".
BUDGET_RUNTIME_FACTOR = 1.5
# The settings that must be positive integers (each is the flag of its name).
_POSITIVE_SETTINGS = (
    'num_layers',
    'hidden_dim',
    'num_heads',
    'mlp_dim',
    'batch',
    'repeats',
    'max_batch',
)


def memory_limit_of_flag(limit_gb: Optional[float]) -> float:
  """--memory_limit_gb in bytes; unset, `default_memory_limit_bytes()`."""
  return default_memory_limit_bytes() if limit_gb is None else limit_gb * 2**30


def memory_budget_of_flag(budget_gb: Optional[float]) -> Optional[float]:
  """--memory_budget_gb in bytes; unset, None (a fixed batch)."""
  return None if budget_gb is None else budget_gb * 2**30


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
  """What to measure; invalid values raise a ConfigError naming the flag.

  Each field is also the command's flag of its name (`settings_flags`), but
  memory_limit_bytes (--memory_limit_gb) and memory_budget_bytes
  (--memory_budget_gb), which the flags give in GiB.

  Attributes:
    seq_lens: sequence lengths n.
    projected_lens: Linformer's projected lengths k; only k < n are measured.
    num_layers: encoder layers.
    hidden_dim: model width.
    num_heads: attention heads; must divide hidden_dim.
    mlp_dim: hidden width of the feed-forward blocks.
    batch: sequences per forward pass.
    repeats: timed runs per cell, after one warm-up run.
    dtype: compute dtype, 'float32' or 'bfloat16'.
    train_throughput: also time a training step per cell.
    matmul_sizes: sides of the square matrix products timed for the
      matrix-multiply rate.
    memory_limit_bytes: at a fixed batch, cells planning more temporary +
      argument bytes are skipped.
    inference_chunk: positions per chunk of the efficient Transformer's and
      Linformer's queries and MLP; 0 runs one pass.
    attention_kernel: the efficient Transformer's attention, one of
      ATTENTION_KERNELS ('cudnn' needs an NVIDIA GPU and bfloat16).
    memory_budget_bytes: None times `batch` sequences; else each cell runs at
      the largest batch whose compiled temporary + argument + output bytes fit.
    max_batch: the largest batch the memory-budget search tries.
    out: the folder the command writes the report into.
  """

  seq_lens: Sequence[int] = setting(tuple(2**p for p in range(9, 17)), 'Sequence lengths n.')
  projected_lens: Sequence[int] = setting(
      (128, 256, 512, 1024, 2048), "Linformer's projected lengths k; only k < n are measured."
  )
  num_layers: int = setting(12, 'Encoder layers.')
  hidden_dim: int = setting(768, 'Model width.')
  num_heads: int = setting(12, 'Attention heads.')
  mlp_dim: int = setting(3072, 'Feed-forward hidden width.')
  batch: int = setting(1, 'Sequences per forward pass; ignored with --memory_budget_gb.')
  repeats: int = setting(10, 'Timed runs per cell.')
  dtype: str = setting('float32', 'Compute dtype.', choices=DTYPES)
  train_throughput: bool = setting(False, 'Also time an MLM training step per cell.')
  matmul_sizes: Sequence[int] = setting(
      (1024, 2048, 4096),
      'Sides of the square jnp.dots timed for the matmul rate (the best counts).',
  )
  memory_limit_bytes: float = setting(
      float('inf'),
      'At a fixed --batch, skip cells planning more temporary + argument '
      'GiB; default 80% of the device memory JAX may use (of the host RAM on '
      'CPU). With --memory_budget_gb it only guards --train_throughput.',
      flag='memory_limit_gb',
      flag_default=None,
      from_flag=memory_limit_of_flag,
  )
  inference_chunk: int = setting(
      0,
      'Positions per chunk of the queries and MLP of Linformer and of an added '
      "memory-efficient Transformer ('transformer-efficient'); 0 runs one pass.",
  )
  attention_kernel: str = setting(
      'einsum',
      'Attention of the memory-efficient Transformer, added at every n unless '
      'einsum with --inference_chunk=0: einsum, or jax.nn.dot_product_attention '
      'with its xla or cudnn (NVIDIA GPU, bfloat16) implementation.',
      choices=ATTENTION_KERNELS,
  )
  memory_budget_bytes: Optional[float] = setting(
      None,
      "The paper's method: run every cell at the largest batch whose compiled "
      'temporary + argument + output bytes fit this many GiB, instead of --batch; '
      'at most --memory_limit_gb / 1.5 (a budget run peaks at about 1.5 times it).',
      flag='memory_budget_gb',
      from_flag=memory_budget_of_flag,
  )
  max_batch: int = setting(4096, 'The largest batch the --memory_budget_gb search tries.')
  out: Optional[str] = setting(
      None, 'Directory for results.csv, table.md and the plots.', required=True
  )

  def __post_init__(self):
    object.__setattr__(self, 'seq_lens', tuple(self.seq_lens))
    object.__setattr__(self, 'projected_lens', tuple(self.projected_lens))
    object.__setattr__(self, 'matmul_sizes', tuple(self.matmul_sizes))
    for name in ('seq_lens', 'projected_lens'):
      flag_checks.require_lengths(name, getattr(self, name))
    flag_checks.require_model_dims(self, _POSITIVE_SETTINGS)
    advice = 'give positive matrix sides, e.g. 1024,2048,4096'
    ok = bool(self.matmul_sizes) and min(self.matmul_sizes) >= 1
    flag_checks.require(ok, 'matmul_sizes', self.matmul_sizes, advice)
    if min(self.projected_lens) >= max(self.seq_lens):
      raise ConfigError(
          f'--projected_lens={",".join(map(str, self.projected_lens))} leaves no '
          f'Linformer cell: every k is >= every n in --seq_lens; use some k < '
          f'{max(self.seq_lens)}.'
      )
    if not self.memory_limit_bytes > 0:
      raise ConfigError('--memory_limit_gb must be positive.')
    self._validate_efficient_transformer()
    budget = self.memory_budget_bytes
    if budget is not None and not budget > 0:
      raise ConfigError(
          f'--memory_budget_gb={budget / 2**30:g} is not allowed: give a positive '
          'number of GiB, e.g. 16, or leave it unset to time a fixed --batch.'
      )
    if budget is not None and budget * BUDGET_RUNTIME_FACTOR > self.memory_limit_bytes:
      limit = self.memory_limit_bytes / 2**30
      raise ConfigError(
          f'--memory_budget_gb={budget / 2**30:g} does not fit this machine: running a '
          f'batch that fills it takes up to {BUDGET_RUNTIME_FACTOR:g}x the budget '
          f'({budget * BUDGET_RUNTIME_FACTOR / 2**30:.1f} GiB), more than the memory limit of '
          f'{limit:.1f} GiB; use --memory_budget_gb={limit / BUDGET_RUNTIME_FACTOR:.1f} or '
          'less, or raise --memory_limit_gb.'
      )

  def _validate_efficient_transformer(self) -> None:
    if self.inference_chunk < 0:
      raise ConfigError(
          f'--inference_chunk={self.inference_chunk} is not allowed: use 0 (one pass) or '
          'a positive number of positions per chunk, e.g. 512.'
      )
    if self.attention_kernel not in ATTENTION_KERNELS:
      raise ConfigError(
          f'--attention_kernel={self.attention_kernel} is not allowed: use one of '
          f'{", ".join(ATTENTION_KERNELS)}.'
      )
    if self.attention_kernel == 'cudnn':
      if self.dtype != 'bfloat16':
        raise ConfigError(
            '--attention_kernel=cudnn needs --dtype=bfloat16 (cuDNN attention takes '
            '16-bit inputs); or use --attention_kernel=xla.'
        )
      if jax.default_backend() != 'gpu':
        raise ConfigError(
            f'--attention_kernel=cudnn needs an NVIDIA GPU, not {jax.default_backend()}; '
            'use --attention_kernel=xla.'
        )

  @property
  def has_efficient_transformer(self) -> bool:
    """Whether the grid adds the memory-efficient Transformer at every n."""
    return self.inference_chunk > 0 or self.attention_kernel != 'einsum'

  def model_config(
      self, model: str, seq_len: int, projected_len: Optional[int] = None
  ) -> ModelConfig:
    """The encoder of one cell of `model`; k is unused (and set to n) but for Linformer.

    The paper's Transformer runs one pass with einsum attention; the efficient
    one with the settings' chunk and kernel; Linformer with the chunk and
    einsum attention.
    """
    if model not in benchmark_report.MODELS:
      raise ValueError(f'Unknown benchmark model {model!r}; use one of {benchmark_report.MODELS}.')
    return ModelConfig(
        vocab_size=VOCAB_SIZE,
        max_len=seq_len,
        num_layers=self.num_layers,
        num_heads=self.num_heads,
        hidden_dim=self.hidden_dim,
        mlp_dim=self.mlp_dim,
        attention='linformer' if model == LINFORMER else 'full',
        projected_len=projected_len if model == LINFORMER else seq_len,
        sharing='layerwise',
        projection='linear',
        dropout_rate=0.0,
        dtype=self.dtype,
        inference_chunk=0 if model == TRANSFORMER else self.inference_chunk,
        attention_kernel=self.attention_kernel if model == EFFICIENT_TRANSFORMER else 'einsum',
    )


def default_memory_limit_bytes() -> float:
  """80% of what JAX may allocate on the first device, else of the host's RAM."""
  stats = memory_stats()
  if stats and stats.get('bytes_limit'):
    total = stats['bytes_limit']
  else:
    total = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  return DEFAULT_MEMORY_FRACTION * total


def memory_stats() -> Optional[Dict[str, int]]:
  try:
    return jax.devices()[0].memory_stats()
  except (NotImplementedError, RuntimeError):
    return None


def time_ms(call: Callable[[], Any], repeats: int) -> List[float]:
  """Wall times (ms) of `repeats` calls after one warm-up call."""
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append((time.perf_counter() - start) * 1e3)
  return times


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


def first_line(error: Exception) -> str:
  return ' '.join(str(error).split())[:200]


def over_limit_note(what: str, planned: Dict[str, int], limit: float) -> str:
  needed = planned['temp_bytes'] + planned['argument_bytes']
  return (
      f'{what} skipped: needs {needed / 2**30:.2f} GiB (temp + arguments) > '
      f'limit {limit / 2**30:.2f} GiB'
  )


def random_variables(abstract_variables: Any, seed: int) -> Any:
  """Normal(0, 0.02) arrays of the given shapes and dtypes, drawn on the host.

  The values do not change the work of a forward or backward pass, and drawing
  them with numpy avoids compiling the model's initialiser once per cell, which
  takes longer than compiling the forward pass itself.
  """
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda leaf: jnp.asarray(
          (0.02 * rng.standard_normal(leaf.shape, np.float32)).astype(leaf.dtype)
      ),
      nn.meta.unbox(abstract_variables),
  )


def _train_step(model: models.MaskedLanguageModel, optimizer: optax.GradientTransformation):
  """One MLM step predicting every token: forward, backward and SGD update."""

  def step(params, opt_state, tokens):
    def loss_fn(p):
      logits = model.apply({'params': p}, tokens, deterministic=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


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
    compiled = jax.jit(_train_step(model, optimizer)).lower(params, opt_state, tokens).compile()
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
  device = jax.devices()[0]
  if settings.memory_budget_bytes is None:
    batch = f'batch {settings.batch}'
  else:
    batch = (
        f'the largest batch (at most {settings.max_batch}) within '
        f'{settings.memory_budget_bytes / 2**30:g} GiB'
    )
  execution = ''
  if settings.inference_chunk:
    execution += f'inference chunk {settings.inference_chunk} (Linformer, efficient Transformer), '
  if settings.attention_kernel != 'einsum':
    execution += f'attention kernel {settings.attention_kernel} (efficient Transformer), '
  return (
      f'Device: {device.device_kind} ({jax.default_backend()}); '
      f'{settings.num_layers} layers, hidden {settings.hidden_dim}, '
      f'{settings.num_heads} heads, MLP {settings.mlp_dim}, '
      f'{batch}, {execution}{settings.dtype}, forward pass, median of '
      f'{settings.repeats} runs.'
  )
