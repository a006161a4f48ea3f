"""Which dtypes the train step's matrix products take, counted in FLOPs.

  python -m linformer_jax.matmul_dtypes --config configs/roberta_base.py \
      --config.model.num_layers=2 --config.model.max_len=4096 \
      --config.model.projected_len=256 --config.batch_size=8

It lowers (never compiles or runs) the train step and prints the FLOPs of every
`stablehlo.dot_general`, 2 x (result elements) x (contracted elements), by operand
and result dtype. A loop body counts once: the step's loop over micro-batches holds
the whole model, so the shares are those of one micro-batch. Under
`model.dtype='bfloat16'` every product should take bfloat16 operands
(docs/training.md).
"""

import collections
import dataclasses
import functools
import math
import re
from typing import Dict, List, Tuple

from absl import flags
import ml_collections

from linformer_jax import cli
from linformer_jax.analysis.tables import markdown_table
from linformer_jax.training import compiled_step
from linformer_jax.training import run_config

# (lhs element type, rhs element type, result element type), as StableHLO
# spells them: 'bf16', 'f32', ...
DotTypes = Tuple[str, str, str]

_FUNCTION = re.compile(r'^\s*func\.func (?:public |private )?@([\w.$-]+)\(')
_CALL = re.compile(r'\bcall @([\w.$-]+)\(')
_DOT = re.compile(
    r'stablehlo\.dot_general .*?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\].*?'
    r': \(tensor<([^>]*)>, tensor<([^>]*)>\) -> tensor<([^>]*)>'
)


def _shape_and_type(tensor_type: str) -> Tuple[List[int], str]:
  """'8x512x768xbf16' -> ([8, 512, 768], 'bf16'); 'f32' -> ([], 'f32')."""
  *dims, element = tensor_type.split('x')
  return [int(d) for d in dims], element


def dot_flops(stablehlo_text: str) -> Dict[DotTypes, int]:
  """FLOPs of the module's matrix products by their types, from its entry
  function `main`, counting each function once per call."""
  own: Dict[str, collections.Counter] = {}
  calls: Dict[str, collections.Counter] = {}
  current = None
  for line in stablehlo_text.splitlines():
    header = _FUNCTION.match(line)
    if header:
      current = header.group(1)
      own[current], calls[current] = collections.Counter(), collections.Counter()
      continue
    if current is None:
      continue
    for callee in _CALL.findall(line):
      calls[current][callee] += 1
    dot = _DOT.search(line)
    if dot:
      contracted = [int(d) for d in dot.group(1).split(',') if d.strip()]
      lhs_shape, lhs_type = _shape_and_type(dot.group(2))
      _, rhs_type = _shape_and_type(dot.group(3))
      out_shape, out_type = _shape_and_type(dot.group(4))
      flops = 2 * math.prod(out_shape) * math.prod(lhs_shape[d] for d in contracted)
      own[current][(lhs_type, rhs_type, out_type)] += flops
  if 'main' not in own:
    raise ValueError('The StableHLO text has no function @main.')

  @functools.cache
  def total(name: str) -> collections.Counter:
    counted = collections.Counter(own[name])
    for callee, count in calls[name].items():
      for types, flops in total(callee).items():
        counted[types] += count * flops
    return counted

  return dict(total('main'))


@dataclasses.dataclass(frozen=True)
class MatmulDtypes:
  """The matrix FLOPs of one lowered train step, by operand dtypes."""

  flops: Dict[DotTypes, int]

  @property
  def total(self) -> int:
    return sum(self.flops.values())

  def share_with_operands(self, element_type: str) -> float:
    """The share of FLOPs whose two operands are both `element_type`."""
    matching = sum(f for (lhs, rhs, _), f in self.flops.items() if lhs == rhs == element_type)
    return matching / self.total


def train_step_matmul_dtypes(config: ml_collections.ConfigDict) -> MatmulDtypes:
  """The matrix FLOPs of the config's train step by operand and result dtype."""
  settings = run_config.RunConfig.from_config(config.copy_and_resolve_references())
  return MatmulDtypes(dot_flops(compiled_step.lowered_train_step(settings).as_text()))


def define_flags() -> None:
  cli.define_config_flags(writes=False)


def main(_: List[str]) -> None:
  config = flags.FLAGS.config
  counted = train_step_matmul_dtypes(config)
  model = config.model
  print(
      f'{model.attention} model, {model.num_layers} layers, dtype {model.dtype}, '
      f'n={model.max_len}, k={model.projected_len}, batch {config.batch_size}: '
      f'{counted.total / 1e9:,.1f} GFLOP of matrix products per step'
  )
  rows = [
      (lhs, rhs, out, f'{flops / 1e9:,.2f}', f'{flops / counted.total:.2%}')
      for (lhs, rhs, out), flops in sorted(counted.flops.items(), key=lambda item: -item[1])
  ]
  print(markdown_table(('lhs', 'rhs', 'result', 'GFLOP', 'share'), rows))
  print(f'bf16 operands: {counted.share_with_operands("bf16"):.2%} of the FLOPs', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
