"""A model's inference pass with what a reader asks for besides its output.

`forward` returns the task head's output, the hidden states (the encoder's
output, or the embeddings' and every layer's) and each layer's attended
queries and keys (`attention_capture.attended_by_layer`), each only when
asked for: the Python API's passes (`Run.logits`, `hidden_states`,
`attention`, calling a run) are all this one function.

It is jitted once per model, input shape and outputs asked for (Flax modules
and ModelConfig hash by value): runs of one config share their programs. A
pass that is not asked for the logits leaves the task head out of the
program. The hidden states are found by name under the model's 'encoder'
(every built-in task's model names its encoder so): a model with scanned
layers has no per-layer ones (`ModelConfig.require_unscanned`).
"""

import functools
from typing import Optional

import flax.linen as nn
import jax

from linformer_jax.model import attention_capture
from linformer_jax.model import layers
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig


def _hidden_state_filter(everything: bool):
  """capture_intermediates' filter of the hidden states: the encoder's output,
  and with `everything` the embeddings' (the encoder's dropout, its last step
  before the layers) and each layer's."""

  def captures(module: nn.Module, method_name: str) -> bool:
    if method_name != '__call__':
      return False
    if isinstance(module, models.Encoder):
      return True
    if not everything:
      return False
    if isinstance(module, layers.EncoderLayer):
      return True
    return isinstance(module, nn.Dropout) and isinstance(module.parent, models.Encoder)

  return captures


@functools.partial(jax.jit, static_argnames=('model', 'config', 'logits', 'hidden', 'attention'))
def forward(
    variables,
    token_ids,
    padding_mask,
    segment_ids,
    *,
    model: nn.Module,
    config: ModelConfig,
    logits: bool,
    hidden: Optional[str],
    attention: bool,
):
  """(logits or None, the hidden states or None, per layer (queries, keys,
  key_mask) or None). `hidden`: None, 'last' (a tuple of the encoder's output)
  or 'all' (num_layers + 1 of them)."""
  segments = {} if segment_ids is None else {'segments': segment_ids}
  if not (hidden or attention):
    return (
        model.apply(variables, token_ids, padding_mask, deterministic=True, **segments),
        None,
        None,
    )
  hidden_filter = _hidden_state_filter(hidden == 'all')

  def captures(module: nn.Module, method_name: str) -> bool:
    return bool(hidden and hidden_filter(module, method_name)) or (
        attention and attention_capture.capture_intermediates(module, method_name)
    )

  out, state = model.apply(
      variables,
      token_ids,
      padding_mask,
      deterministic=True,
      capture_intermediates=captures,
      mutable=['intermediates'],
      **segments,
  )
  captured = state['intermediates']
  encoder = captured['encoder']
  states = None
  if hidden == 'last':
    states = (encoder['__call__'][0],)
  elif hidden == 'all':
    layer_outputs = [encoder[f'layers_{i}']['__call__'][0] for i in range(config.num_layers - 1)]
    states = (encoder['dropout']['__call__'][0], *layer_outputs, encoder['__call__'][0])
  queries_and_keys = None
  if attention:
    queries_and_keys = attention_capture.attended_by_layer(captured, config)
  return (out if logits else None), states, queries_and_keys
