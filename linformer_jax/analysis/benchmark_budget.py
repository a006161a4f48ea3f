"""One cell's compiled forward pass: its memory, its cost, the paper's max-batch method.

`ForwardPass` compiles a benchmark cell's encoder for any batch.
`compile_within_budget` finds the largest batch whose compiled memory fits a
budget by compiling only, so no device memory is touched and the answer is
exact and repeatable (docs/benchmarks.md, "at the largest batch that fits").
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linformer_jax.model import inference_chunks
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import compiled_step
from linformer_jax.units import GIB


class ForwardPass:
  """One cell's encoder as a jitted deterministic forward pass, compiled per batch.

  config.max_len is the sequence length n; abstract_variables holds the shapes
  and dtypes of its variables (no arrays).
  """

  def __init__(self, config: ModelConfig):
    self.config = config
    model = models.Encoder(config)
    self.abstract_variables = nn.meta.unbox(
        jax.eval_shape(model.init, jax.random.PRNGKey(0), self.tokens_shape(1))
    )
    self._forward = jax.jit(
        lambda variables, tokens: model.apply(variables, tokens, deterministic=True)
    )

  def tokens_shape(self, batch: int) -> jax.ShapeDtypeStruct:
    """The token ids' [batch, n] shape and dtype."""
    return jax.ShapeDtypeStruct((batch, self.config.max_len), jnp.int32)

  def compile(self, batch: int):
    """The pass compiled for `batch` sequences, without running it."""
    return self._forward.lower(self.abstract_variables, self.tokens_shape(batch)).compile()

  def cost(self, compiled, batch: int) -> Dict[str, Optional[float]]:
    """XLA's FLOPs and bytes accessed of the pass `compiled` at `batch`.

    XLA counts a loop's body once, so a pass run in inference chunks takes its
    FLOPs from the encoder compiled as one pass (the same arithmetic, less the
    last chunk's padding) and reports no bytes accessed, which chunking changes.
    """
    config = self.config
    if inference_chunks.inference_chunk(config, config.max_len, deterministic=True) is None:
      return compiled_step.cost_analysis(compiled)
    one_pass = ForwardPass(dataclasses.replace(config, inference_chunk=0)).compile(batch)
    return {'flops': compiled_step.cost_analysis(one_pass)['flops'], 'bytes_accessed': None}


def budgeted_bytes(planned: Dict[str, int]) -> int:
  """The bytes a memory budget counts: temporaries + arguments + outputs."""
  return planned['temp_bytes'] + planned['argument_bytes'] + planned['output_bytes']


def parameter_bytes(variables: Any) -> int:
  """Bytes of a pytree of arrays or `jax.ShapeDtypeStruct`s."""
  return sum(
      int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
      for leaf in jax.tree_util.tree_leaves(variables)
  )


def search_batches(
    fits: Callable[[int], bool],
    fitting: int,
    missing: Optional[int],
    probe: int,
    grow: Callable[[int], int],
    more_calls: Callable[[], bool] = lambda: True,
    narrow: Callable[[int, int], int] = lambda fitting, missing: (fitting + missing) // 2,
) -> Tuple[int, Optional[int]]:
  """Narrows `fitting` (a batch that fits) and `missing` (the smallest batch known
  not to, None if none): tries `probe`, then `grow(fitting)` until a batch
  misses, then `narrow(fitting, missing)` (bisection by default); stops where
  the next probe is not between the two or `more_calls()` is False. Returns
  the last (fitting, missing).
  """
  while more_calls() and fitting < probe and (missing is None or probe < missing):
    if fits(probe):
      fitting = probe
    else:
      missing = probe
    probe = grow(fitting) if missing is None else narrow(fitting, missing)
  return fitting, missing


def largest_fitting_batch(fits: Callable[[int], bool], max_batch: int) -> Optional[int]:
  """The largest batch in [1, max_batch] for which `fits` holds; None if 1 does not.

  Doubles from 1 until a batch misses (or max_batch fits), then bisects: about
  2 log2(answer) calls. Assumes that a batch fits whenever a larger one does.
  """
  fitting, _ = search_batches(fits, 0, None, 1, lambda fitting: min(2 * fitting, max_batch))
  return fitting or None


def compile_within_budget(
    forward: ForwardPass, budget_bytes: float, max_batch: int
) -> Tuple[Any, Dict[str, Any]]:
  """The pass compiled at the largest batch within the budget, and the row's fields.

  The budget counts `budgeted_bytes`; batches up to max_batch are tried. The
  fields are batch, budget_batch, the compiled bytes, bytes_per_sequence (less
  the parameters', over the batch) and a note where the search was capped.
  Where batch 1 does not fit, the pass is None and the fields hold batch 1's
  bytes (if it compiled) and a note saying why the cell is skipped.
  """
  kept = {}

  def fits(batch: int) -> bool:
    try:
      compiled = forward.compile(batch)
    except Exception as error:  # pylint: disable=broad-except
      if not compiled_step.is_out_of_memory(error):
        raise
      compiled = None  # Out of memory compiling: the batch does not fit.
    if batch == 1:
      kept['batch_one'] = compiled
    if compiled is None or budgeted_bytes(compiled_step.planned_bytes(compiled)) > budget_bytes:
      return False
    kept['largest_fitting'] = compiled  # Each batch that fits is larger than the last.
    return True

  batch = largest_fitting_batch(fits, max_batch)
  budget = f'budget {budget_bytes / GIB:.2f} GiB'
  if batch is None:
    if kept['batch_one'] is None:
      return None, {'batch': 1, 'note': 'cell skipped: batch 1 ran out of memory compiling'}
    planned = compiled_step.planned_bytes(kept['batch_one'])
    needs = f'{budgeted_bytes(planned) / GIB:.2f} GiB (temp + arguments + outputs)'
    return None, {'batch': 1, **planned, 'note': f'cell skipped: batch 1 needs {needs} > {budget}'}
  compiled = kept['largest_fitting']
  planned = compiled_step.planned_bytes(compiled)
  parameters = parameter_bytes(forward.abstract_variables)
  fields = {
      'batch': batch,
      'budget_batch': batch,
      **planned,
      'bytes_per_sequence': (budgeted_bytes(planned) - parameters) / batch,
  }
  if batch == max_batch:
    fields['note'] = f'{budget} not reached: the batch is capped at --max_batch={max_batch}'
  return compiled, fields
