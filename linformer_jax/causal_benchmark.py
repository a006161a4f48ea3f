"""Causal language model benchmark: Linformer causal block attention against the Transformer.

  python -m linformer_jax.causal_benchmark --out=/tmp/causal_bench_out \
      --contexts=1024,2048,4096,8192,16384,32768 --seq_lens=1024,2048,4096,8192,16384 \
      --block_len=128 --slots=16 --linformer_query_blocks=0,4 --repeats=10

Times generation (one decode step at position C - 1: ms per token against the
context C) and the full causal forward pass (against n), with XLA's compiled
memory and FLOPs. Writes results.csv, table.md (also printed), generation.png
and forward.png into --out. What each cell measures is described in
`linformer_jax.analysis.causal_benchmark`. Bad flags end with a one-line error
and exit code 2.
"""

import sys
from typing import Any, Dict

from absl import flags

from linformer_jax import cli
from linformer_jax.analysis import causal_benchmark
from linformer_jax.analysis.benchmark import default_memory_limit_bytes
from linformer_jax.analysis.causal_benchmark import CausalBenchmarkSettings
from linformer_jax.model import projections
from linformer_jax.model.model_config import SHARING_MODES

_DEFAULTS = CausalBenchmarkSettings()
_OUT = flags.DEFINE_string('out', None, 'Directory for results.csv, table.md and the plots.')
flags.mark_flag_as_required('out')
_CONTEXTS = flags.DEFINE_list(
    'contexts',
    list(map(str, _DEFAULTS.contexts)),
    'Context lengths C at which one generated token is timed (max_len = C); empty: skip.',
)
_SEQ_LENS = flags.DEFINE_list(
    'seq_lens',
    list(map(str, _DEFAULTS.seq_lens)),
    'Sequence lengths n of the timed forward pass; empty: skip.',
)
_NUM_LAYERS = flags.DEFINE_integer('num_layers', _DEFAULTS.num_layers, 'Layers.')
_HIDDEN_DIM = flags.DEFINE_integer('hidden_dim', _DEFAULTS.hidden_dim, 'Model width.')
_NUM_HEADS = flags.DEFINE_integer('num_heads', _DEFAULTS.num_heads, 'Attention heads.')
_MLP_DIM = flags.DEFINE_integer('mlp_dim', _DEFAULTS.mlp_dim, 'Feed-forward hidden width.')
_BATCH = flags.DEFINE_integer('batch', _DEFAULTS.batch, 'Sequences per call.')
_REPEATS = flags.DEFINE_integer(
    'repeats', _DEFAULTS.repeats, 'Timed runs per cell, after a warm-up.'
)
_DTYPE = flags.DEFINE_enum('dtype', _DEFAULTS.dtype, ['float32', 'bfloat16'], 'Compute dtype.')
_BLOCK_LEN = flags.DEFINE_integer(
    'block_len', _DEFAULTS.block_len, "Linformer's block b; lengths it does not divide are skipped."
)
_SLOTS = flags.DEFINE_integer(
    'slots', _DEFAULTS.slots, "Linformer's summaries per block r (projected_len)."
)
_SHARING = flags.DEFINE_enum(
    'sharing', _DEFAULTS.sharing, SHARING_MODES, "Linformer's E/F sharing."
)
_PROJECTION = flags.DEFINE_enum(
    'projection',
    _DEFAULTS.projection,
    projections.REGISTRY.names(),
    "Linformer's block compression.",
)
_LINFORMER_QUERY_BLOCKS = flags.DEFINE_list(
    'linformer_query_blocks',
    list(map(str, _DEFAULTS.linformer_query_blocks)),
    'Forward pass: one Linformer row per query_blocks_per_step (0: all blocks at once), e.g. 0,4.',
)
_MEMORY_LIMIT_GB = flags.DEFINE_float(
    'memory_limit_gb',
    None,
    'Skip the timing of cells planning more temporary + argument GiB; default 80% of the '
    'device memory JAX may use (of the host RAM on CPU).',
)


def settings_from_flags() -> CausalBenchmarkSettings:
  """Builds the validated settings from the command-line flags."""
  limit_gb = _MEMORY_LIMIT_GB.value
  return CausalBenchmarkSettings(
      contexts=cli.int_list('contexts', _CONTEXTS.value),
      seq_lens=cli.int_list('seq_lens', _SEQ_LENS.value),
      num_layers=_NUM_LAYERS.value,
      hidden_dim=_HIDDEN_DIM.value,
      num_heads=_NUM_HEADS.value,
      mlp_dim=_MLP_DIM.value,
      batch=_BATCH.value,
      repeats=_REPEATS.value,
      dtype=_DTYPE.value,
      block_len=_BLOCK_LEN.value,
      slots=_SLOTS.value,
      sharing=_SHARING.value,
      projection=_PROJECTION.value,
      linformer_query_blocks=cli.int_list('linformer_query_blocks', _LINFORMER_QUERY_BLOCKS.value),
      memory_limit_bytes=(default_memory_limit_bytes() if limit_gb is None else limit_gb * 2**30),
  )


def _print_progress(row: Dict[str, Any]) -> None:
  result = f"{row['time_ms']:.3f} ms" if row['time_ms'] is not None else row['note']
  print(f'{causal_benchmark.cell_name(row)}: {result}', file=sys.stderr, flush=True)


def main(argv):
  del argv
  settings = settings_from_flags()
  rows = causal_benchmark.run_all(settings, progress=_print_progress)
  header = causal_benchmark.describe_run(settings)
  print(causal_benchmark.write_outputs(rows, _OUT.value, header))


if __name__ == '__main__':
  cli.run(main)
