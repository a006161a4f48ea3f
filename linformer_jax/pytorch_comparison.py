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

import sys
from typing import Any, Dict

from linformer_jax import cli
from linformer_jax.analysis import settings_flags
from linformer_jax.analysis.pytorch_comparison import ComparisonSettings
from linformer_jax.analysis.pytorch_comparison import TorchBaselineError
from linformer_jax.analysis.pytorch_comparison import compare
from linformer_jax.analysis.pytorch_comparison import describe_run
from linformer_jax.analysis.pytorch_comparison import write_report

# The exit code of a PyTorch baseline that failed while running.
BASELINE_FAILED_EXIT_CODE = 1

settings_flags.define_flags(ComparisonSettings)


def _print_progress(row: Dict[str, Any]) -> None:
  print(
      f'n={row["seq_len"]} {row["mode"]}: JAX {row["jax_tokens_per_s"]:,.0f} tokens/s, '
      f'PyTorch {row["torch_tokens_per_s"]:,.0f} tokens/s',
      file=sys.stderr,
      flush=True,
  )


def main(argv):
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}; pass settings as --FLAG=VALUE (see --help)')
  settings = settings_flags.from_flags(ComparisonSettings)
  try:
    rows = compare(settings, settings.torch_python, progress=_print_progress)
  except TorchBaselineError as error:
    print(f'error: {error}', file=sys.stderr, flush=True)
    sys.exit(BASELINE_FAILED_EXIT_CODE)
  print(write_report(rows, settings.out, describe_run(settings, rows)))


if __name__ == '__main__':
  cli.run(main)
