"""Chunked inference passes: queries and the MLP run a chunk of positions at a time.

`config.model.inference_chunk` > 0 has the layers (`layers`) run their
queries and MLP chunk by chunk in the deterministic passes of bidirectional
models: the same outputs, with temporaries of one chunk. The chunks run in a
`jax.lax.map` over a bound submodule made a pure function, so that XLA reuses
one chunk's buffers for the next.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from linformer_jax.model.model_config import ModelConfig

Array = jax.Array


def inference_chunk(cfg: ModelConfig, length: int, deterministic: bool) -> Optional[int]:
  """Positions per chunk of a chunked inference pass, None for one pass.

  `config.inference_chunk` > 0 runs queries and the MLP chunk by chunk in
  deterministic (inference) passes of bidirectional models: the same outputs,
  with temporaries of O(chunk x k) for Linformer attention and O(chunk x n)
  for full attention instead of O(n x k) and O(n x n). Training keeps one
  pass (backpropagation would keep every chunk's activations anyway).
  """
  chunk = cfg.inference_chunk
  if not chunk or not deterministic or cfg.causal or chunk >= length:
    return None
  return chunk


def pure(module: nn.Module):
  """A bound submodule as a pure function of its inputs, with its parameters.

  What `jax.lax.map` needs to run it inside a loop body.
  """
  unbound, variables = module.clone(parent=None), module.variables
  return lambda *args: unbound.apply(variables, *args)


def in_chunks(fn, x: Array, chunk: Optional[int]) -> Array:
  """fn (a pure function of rows) over x [batch, length, ...], chunk by chunk.

  A `jax.lax.map` over chunks, so XLA runs them one after another and one
  chunk's temporaries are reused by the next. The last chunk is padded with
  copies of the final rows; fn must treat rows independently (queries, the
  MLP), so the padding is dropped from the output.
  """
  if chunk is None:
    return fn(x)
  batch, length = x.shape[:2]
  num_chunks = -(-length // chunk)
  padding = num_chunks * chunk - length
  if padding:
    x = jnp.concatenate([x, jnp.repeat(x[:, -1:], padding, axis=1)], axis=1)
  chunks = jnp.moveaxis(x.reshape(batch, num_chunks, chunk, *x.shape[2:]), 1, 0)
  out = jax.lax.map(fn, chunks)
  out = jnp.moveaxis(out, 0, 1).reshape(batch, num_chunks * chunk, *out.shape[3:])
  return out[:, :length]
