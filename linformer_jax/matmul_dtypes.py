"""The train step's matrix FLOPs by operand dtype, read from its StableHLO.

  python -m linformer_jax.matmul_dtypes --config configs/roberta_base.py \
      --config.model.num_layers=2 --config.model.max_len=4096 \
      --config.model.projected_len=256 --config.batch_size=8

Lowers (never compiles or runs) the train step of the config and prints the
FLOPs of its matrix products by operand and result dtype, and the share whose
operands are both bfloat16: under `model.dtype='bfloat16'` the rest runs at a
slower rate on an accelerator's matrix units. See linformer_jax.analysis.matmul_dtypes.
"""

from typing import List

from absl import flags

from linformer_jax import cli
from linformer_jax.analysis.matmul_dtypes import train_step_matmul_dtypes

cli.define_config_flags()
flags.FLAGS.set_default('workdir', '')  # nothing is written; --workdir is not needed
FLAGS = flags.FLAGS


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}')
  config = FLAGS.config
  counted = train_step_matmul_dtypes(config)
  model = config.model
  print(
      f'{model.attention} model, {model.num_layers} layers, dtype {model.dtype}, '
      f'n={model.max_len}, k={model.projected_len}, batch {config.batch_size}: '
      f'{counted.total / 1e9:,.1f} GFLOP of matrix products per step'
  )
  print('| lhs | rhs | result | GFLOP | share |')
  print('|---|---|---|---|---|')
  for (lhs, rhs, out), flops in sorted(counted.flops.items(), key=lambda item: -item[1]):
    print(f'| {lhs} | {rhs} | {out} | {flops / 1e9:,.2f} | {flops / counted.total:.2%} |')
  print(f'bf16 operands: {counted.share_with_operands("bf16"):.2%} of the FLOPs', flush=True)


if __name__ == '__main__':
  cli.run(main)
