"""Causal language model: Linformer causal block attention against the causal Transformer.

  python -m linformer_jax.causal_benchmark --out=/tmp/causal_bench_out \
      --contexts=1024,2048,4096,8192,16384,32768 --seq_lens=1024,2048,4096,8192,16384 \
      --block_len=128 --slots=16 --linformer_query_blocks=0,4 --repeats=10

Both models are the `CausalLanguageModel` of one `ModelConfig` (causal=True, random
parameters), attention 'full' or 'linformer' (blocks of b = block_len tokens, each
compressed into r = slots summaries). Two measurements:

  generation  one jitted decode step at position C - 2 (not a block's last token, which
              also compresses the block) of a model with max_len = C. The Transformer
              attends over its KV cache of all C positions, growing linearly in C; the
              Linformer over b + (C / b) * r slots, nearly flat in C while (C / b) * r
              is small (the goal: flat within 25%, reported, not asserted).
  forward     a full causal forward pass (logits) over n tokens.

The decode step donates its cache, which XLA updates in place (alias_bytes = the
cache); its time includes Python's dispatch of the parameters and cache. The command
writes results.csv, table.md, generation.png and forward.png into --out. Results and
what they show: docs/causal_lm.md.
"""

import dataclasses
import functools
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.analysis import benchmark_settings
from linformer_jax.analysis import measuring
from linformer_jax.analysis.benchmark_budget import parameter_bytes
from linformer_jax.analysis.benchmark_report import memory_bytes
from linformer_jax.analysis.causal_benchmark_report import COLUMNS
from linformer_jax.analysis.causal_benchmark_report import cell_name
from linformer_jax.analysis.causal_benchmark_report import write_outputs
from linformer_jax.model import generation
from linformer_jax.model import models
from linformer_jax.model import projections
from linformer_jax.model.layers import CACHE
from linformer_jax.model.model_config import SHARING_MODES
from linformer_jax.settings_flags import require
from linformer_jax.settings_flags import setting
from linformer_jax.training import compiled_step
from linformer_jax.units import GIB


@dataclasses.dataclass(frozen=True)
class CausalBenchmarkSettings(benchmark_settings.model_size_settings(12, 768, 12, 3072)):
  """What to measure; invalid values raise a ConfigError naming the flag. Each field is
  also the command's flag of its name, but memory_limit_bytes (--memory_limit_gb, in GiB)."""

  contexts: Sequence[int] = setting(
      (1024, 2048, 4096, 8192, 16384, 32768),
      'Context lengths C at which one generated token is timed (max_len = C); empty: skip.',
  )
  seq_lens: Sequence[int] = setting(
      (1024, 2048, 4096, 8192, 16384), 'Sequence lengths n of the timed forward pass; empty: skip.'
  )
  batch: int = setting(1, 'Sequences per call.', minimum=1)
  repeats: int = setting(10, 'Timed runs per cell, after a warm-up.', minimum=1)
  dtype: str = setting('float32', 'Compute dtype.', choices=benchmark_settings.DTYPES)
  block_len: int = setting(
      128, "Linformer's block b; lengths it does not divide are skipped.", minimum=1
  )
  slots: int = setting(16, "Linformer's summaries per block r (projected_len).")
  sharing: str = setting('layerwise', "Linformer's E/F sharing.", choices=SHARING_MODES)
  projection: str = setting(
      'linear', "Linformer's block compression.", choices=projections.REGISTRY.names()
  )
  linformer_query_blocks: Sequence[int] = setting(
      (0,),
      'Forward pass: one Linformer row per query_blocks_per_step '
      '(0: all blocks at once), e.g. 0,4.',
      minimum=0,
  )
  memory_limit_bytes: float = setting(
      float('inf'),
      'Skip the timing of cells planning more temporary + argument GiB; default 80% of the '
      'device memory JAX may use (of the host RAM on CPU).',
      flag='memory_limit_gb',
      flag_default=None,
      from_flag=benchmark_settings.memory_limit_of_flag,
  )
  out: Optional[str] = setting(
      None, 'Directory for results.csv, table.md and the plots.', required=True
  )

  def __post_init__(self):
    settings_flags.check(self)
    for name in ('contexts', 'seq_lens'):
      lengths = getattr(self, name)
      require(all(n >= 1 for n in lengths), name, lengths, 'give positive integers')
    benchmark_settings.require_heads_divide_width(self)
    advice = f'use 1 <= slots <= --block_len={self.block_len}'
    require(1 <= self.slots <= self.block_len, 'slots', self.slots, advice)
    ok = not projections.kind(self.projection).windowed or self.block_len % self.slots == 0
    advice = f'--projection={self.projection} needs it to divide --block_len={self.block_len}'
    require(ok, 'slots', self.slots, advice)
    advice = f'no Linformer cell is left: --block_len={self.block_len} divides none of them'
    for name in ('contexts', 'seq_lens'):
      lengths = getattr(self, name)
      ok = not lengths or min(n % self.block_len for n in lengths) == 0
      require(ok, name, lengths, advice)
    limit_gb = self.memory_limit_bytes / GIB
    ok = self.memory_limit_bytes > 0
    require(ok, 'memory_limit_gb', limit_gb, 'use a positive size')

  def model_config(self, attention: str, max_len: int, query_blocks_per_step: int = 0):
    """The causal language model of one cell; r is unused (set to max_len) for 'full'."""
    same = ('sharing', 'projection', 'dtype', 'block_len')
    return benchmark_settings.benchmark_model(
        self,
        **{name: getattr(self, name) for name in same},
        max_len=max_len,
        attention=attention,
        projected_len=self.slots if attention == 'linformer' else max_len,
        causal=True,
        query_blocks_per_step=query_blocks_per_step,
    )


def describe_run(s: CausalBenchmarkSettings) -> str:
  """One line naming the device and the settings, for the top of table.md."""
  return (
      f'Device: {measuring.describe_device()}; causal LM, {s.num_layers} layers, '
      f'hidden {s.hidden_dim}, {s.num_heads} heads, MLP {s.mlp_dim}, '
      f'vocabulary {benchmark_settings.VOCAB_SIZE}, batch {s.batch}, {s.dtype}; '
      f'Linformer b = {s.block_len}, r = {s.slots}, sharing {s.sharing}, '
      f'projection {s.projection}; median of {s.repeats} runs.'
  )


def decode_token(model: nn.Module, variables: Any, cache: Any, tokens: jax.Array):
  """Logits of tokens [batch, 1] at the cache's position, and the updated cache with
  that position left unchanged, so that every timed call decodes the same token."""
  logits, updated = model.apply({**variables, 'cache': cache}, tokens, decode=True, mutable=[CACHE])
  return logits, {**updated['cache'], 'position': cache['position']}


def _abstract_params(model: nn.Module, tokens: jax.ShapeDtypeStruct, **kwargs) -> Any:
  init = lambda: model.init(jax.random.PRNGKey(0), tokens, **kwargs)
  shapes = nn.meta.unbox(jax.eval_shape(init))
  return {name: value for name, value in shapes.items() if name != 'cache'}


def decode_cache(model: nn.Module, batch: int, position: int) -> Any:
  """The empty cache of `generation.empty_cache` with its position set: zero
  blocks and summaries, which cost the same work as real ones."""
  return {**generation.empty_cache(model, batch), 'position': jnp.asarray(position, jnp.int32)}


def compile_decode(settings: CausalBenchmarkSettings, attention: str, context: int):
  """The decode step at position context - 2, compiled with its cache donated: returns
  (compiled, model, abstract parameters, abstract cache); compiled takes (variables,
  cache, tokens [batch, 1])."""
  model = models.CausalLanguageModel(settings.model_config(attention, context))
  tokens = jax.ShapeDtypeStruct((settings.batch, 1), jnp.int32)
  params = _abstract_params(model, tokens, decode=True)
  cache = jax.eval_shape(lambda: decode_cache(model, settings.batch, context - 2))
  step = jax.jit(functools.partial(decode_token, model), donate_argnums=1)
  return step.lower(params, cache, tokens).compile(), model, params, cache


def _new_row(settings, name: str, attention: str, length: int, query_blocks: int = 0):
  """A row's identity (b, r and query blocks 0 for the Transformer); a note if it cannot run."""
  row: Dict[str, Any] = dict.fromkeys(COLUMNS)
  row.update(benchmark=name, model='transformer', length=length, batch=settings.batch, note='')
  row.update(block_len=0, slots=0, query_blocks_per_step=0, cache_donated=name == 'generation')
  row.update(dtype=settings.dtype, device=measuring.describe_device())
  if attention == 'linformer':
    row.update(model='linformer', block_len=settings.block_len, slots=settings.slots)
    row['query_blocks_per_step'] = query_blocks
    if length % settings.block_len:
      row['note'] = f'skipped: block_len={settings.block_len} does not divide {length}'
  return row


def _measure(row, settings, compile_step: Callable, make_args: Callable, tokens_per_call: int):
  """Fills row from XLA's plan of compile_step() and, where it fits, its timing on
  make_args(). A donated cache (argument 1, output 1) is consumed by each call, so
  the next call takes the one it returned."""
  try:
    compiled = compile_step()
    row.update(compiled_step.planned_bytes(compiled))
    row['flops'] = compiled_step.cost_analysis(compiled)['flops']
    row['flops_per_token'] = row['flops'] and row['flops'] / tokens_per_call
    if memory_bytes(row) > settings.memory_limit_bytes:
      row['note'] = measuring.over_limit_note('timing', row, settings.memory_limit_bytes)
      return row
    args = list(make_args())

    def call():
      outputs = compiled(*args)
      if row['cache_donated']:
        args[1] = outputs[1]
      return outputs

    row.update(measuring.timing(measuring.time_ms(call, settings.repeats), tokens_per_call))
  except Exception as error:  # pylint: disable=broad-except
    row['note'] = f'timing skipped: {measuring.out_of_memory(error)}'
  return row


def generation_cell(settings: CausalBenchmarkSettings, attention: str, context: int):
  """Time, memory and FLOPs of generating token `context` (one decode step)."""
  row = _new_row(settings, 'generation', attention, context)
  if row['note']:
    return row
  compiled, model, params, cache = compile_decode(settings, attention, context)
  row['cache_bytes'] = parameter_bytes(cache)

  def make_args():
    variables = measuring.random_variables(params, seed=0)
    cache = decode_cache(model, settings.batch, context - 2)
    return variables, cache, jnp.zeros((settings.batch, 1), jnp.int32)

  return _measure(row, settings, lambda: compiled, make_args, settings.batch)


def forward_cell(settings: CausalBenchmarkSettings, attention: str, seq_len: int, query_blocks=0):
  """Time, memory and FLOPs of a causal forward pass over seq_len tokens."""
  row = _new_row(settings, 'forward', attention, seq_len, query_blocks)
  if row['note']:
    return row
  model = models.CausalLanguageModel(settings.model_config(attention, seq_len, query_blocks))
  tokens = jax.ShapeDtypeStruct((settings.batch, seq_len), jnp.int32)
  params = _abstract_params(model, tokens)
  step = jax.jit(lambda variables, tokens: model.apply(variables, tokens, deterministic=True))

  def make_args():
    ids = measuring.random_tokens(tokens.shape, benchmark_settings.VOCAB_SIZE, seed=seq_len)
    return measuring.random_variables(params, seed=0), ids

  compile_step = lambda: step.lower(params, tokens).compile()
  return _measure(row, settings, compile_step, make_args, settings.batch * seq_len)


def run_all(settings: CausalBenchmarkSettings, progress: Optional[Callable] = None) -> List[Dict]:
  """Every generation cell (per C: Transformer, Linformer), then every forward cell."""
  cells = [(generation_cell, a, c) for c in settings.contexts for a in ('full', 'linformer')]
  for seq_len in settings.seq_lens:
    cells.append((forward_cell, 'full', seq_len))
    cells += [(forward_cell, 'linformer', seq_len, q) for q in settings.linformer_query_blocks]
  rows = []
  for measure, *arguments in cells:
    rows.append(measure(settings, *arguments))
    if progress:
      progress(rows[-1])
  return rows


def _print_progress(row: Dict[str, Any]) -> None:
  result = f"{row['time_ms']:.3f} ms" if row['time_ms'] is not None else row['note']
  print(f'{cell_name(row)}: {result}', file=sys.stderr, flush=True)


def define_flags() -> None:
  settings_flags.define_flags(CausalBenchmarkSettings)


def main(_):
  settings = settings_flags.from_flags(CausalBenchmarkSettings)
  rows = run_all(settings, progress=_print_progress)
  print(write_outputs(rows, settings.out, describe_run(settings)))


if __name__ == '__main__':
  define_flags()
  cli.run(main)
