"""Tokens/s of our Linformer against the PyTorch `linformer` package, side by side.

Once, to install torch and linformer==0.2.3 into .venv-torch (never into the
project's environment):

  make torch-baseline

Then, a forward pass and a training step (forward, backward, AdamW) at each n:

  python -m linformer_jax.pytorch_comparison --out=/tmp/torch_comparison \
      --seq_lens=512,1024,2048,4096,8192 --projected_len=256 --num_layers=2 \
      --hidden_dim=768 --num_heads=12 --batch=1 --repeats=5

Writes comparison.md (n | mode | JAX tokens/s | PyTorch tokens/s | ratio under
a line naming the devices, versions and settings; also printed) and
comparison.csv into --out. What each mode measures is described in
`linformer_jax.analysis.pytorch_comparison`. Bad flags, or no interpreter at
--torch_python, end with a one-line error and exit code 2; a failing PyTorch
script ends with the end of its stderr and exit code 1.
"""

import os
import sys
from typing import Any, Dict

from absl import flags

from linformer_jax import cli
from linformer_jax.analysis.pytorch_comparison import MODES
from linformer_jax.analysis.pytorch_comparison import ComparisonSettings
from linformer_jax.analysis.pytorch_comparison import TorchBaselineError
from linformer_jax.analysis.pytorch_comparison import compare
from linformer_jax.analysis.pytorch_comparison import describe_run
from linformer_jax.analysis.pytorch_comparison import write_report

# The exit code of a PyTorch baseline that failed while running.
BASELINE_FAILED_EXIT_CODE = 1

_OUT = flags.DEFINE_string('out', None, 'Directory for comparison.md and comparison.csv.')
flags.mark_flag_as_required('out')
_SEQ_LENS = flags.DEFINE_list(
    'seq_lens', ['512', '1024', '2048', '4096', '8192'], 'Sequence lengths n; only n > k run.'
)
_PROJECTED_LEN = flags.DEFINE_integer('projected_len', 256, "Linformer's projected length k.")
_NUM_LAYERS = flags.DEFINE_integer('num_layers', 2, 'Encoder layers.')
_HIDDEN_DIM = flags.DEFINE_integer('hidden_dim', 768, 'Model width (the MLP is 4 times as wide).')
_NUM_HEADS = flags.DEFINE_integer('num_heads', 12, 'Attention heads.')
_BATCH = flags.DEFINE_integer('batch', 1, 'Sequences per pass or step.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed runs per (n, mode), after a warm-up.')
_MODES = flags.DEFINE_list(
    'modes', list(MODES), 'forward (inference pass), train (forward, backward, AdamW).'
)
_TORCH_PYTHON = flags.DEFINE_string(
    'torch_python',
    '.venv-torch/bin/python',
    'The Python that has torch and linformer==0.2.3 (`make torch-baseline` makes it).',
)
_THREADS = flags.DEFINE_integer(
    'threads',
    None,
    "PyTorch's intra-op threads; default os.cpu_count() (JAX on CPU uses one per core).",
)


def settings_from_flags() -> ComparisonSettings:
  """Builds the validated settings from the command-line flags."""
  return ComparisonSettings(
      seq_lens=cli.int_list('seq_lens', _SEQ_LENS.value),
      projected_len=_PROJECTED_LEN.value,
      num_layers=_NUM_LAYERS.value,
      hidden_dim=_HIDDEN_DIM.value,
      num_heads=_NUM_HEADS.value,
      batch=_BATCH.value,
      repeats=_REPEATS.value,
      modes=_MODES.value,
      threads=(os.cpu_count() or 1) if _THREADS.value is None else _THREADS.value,
  )


def _print_progress(row: Dict[str, Any]) -> None:
  print(
      f'n={row["seq_len"]} {row["mode"]}: JAX {row["jax_tokens_per_s"]:,.0f} tokens/s, '
      f'PyTorch {row["torch_tokens_per_s"]:,.0f} tokens/s',
      file=sys.stderr,
      flush=True,
  )


def main(argv):
  del argv
  settings = settings_from_flags()
  try:
    rows = compare(settings, _TORCH_PYTHON.value, progress=_print_progress)
  except TorchBaselineError as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(BASELINE_FAILED_EXIT_CODE)
  print(write_report(rows, _OUT.value, describe_run(settings, rows)))


if __name__ == '__main__':
  cli.run(main)
