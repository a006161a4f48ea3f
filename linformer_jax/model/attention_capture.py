"""What each layer attends with, read from a forward pass: queries, keys, P.

Analyses (the spectrum of P, the pooling probe) and the Python API's
`attention` read a layer's queries and the keys they attend over without a
second copy of the model's code. A pass with Flax's `capture_intermediates`
(filter `capture_intermediates` below) records the 'query' and 'key' dense
layers' outputs and the sequence projections' weights E/F; a Linformer layer
that compresses its input first sows its compressed keys itself
('compressed_keys'). `context_queries_and_keys` turns that record into, per
layer, the queries, the keys (E^T K for the Linformer) and the mask of keys
that may be attended to; `attention_matrix` gives
P = softmax(Q K^T / sqrt(d)) from them, in float64.

The layers are found by name (layers_0, layers_1, ...) under the model's
'encoder': a model with scanned layers has none (`ModelConfig.require_unscanned`).
P is the attention of the built-in bidirectional kinds; `require_plain_softmax`
refuses a model whose layers weigh their keys otherwise.
"""

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.attention_kinds.linformer import Linformer
from linformer_jax.model.layers import SequenceProjection
from linformer_jax.model.model_config import ModelConfig


def capture_intermediates(module: Any, method_name: str) -> bool:
  """Filter for flax's capture_intermediates: Q, K and the E/F projections."""
  return method_name == '__call__' and (
      module.name in ('query', 'key') or isinstance(module, SequenceProjection)
  )


def require_plain_softmax(config: ModelConfig, reader: str) -> None:
  """A ConfigError unless each layer of the model attends as `attention_matrix`
  computes: bidirectional, with the built-in keys (all n, or the projection's k
  slots) and softmax(Q K^T / sqrt(d)). A kind that changes either (a
  temperature, a scale, keys of its own) or a causal model would get a P it
  never used.

  Args:
    config: the model's config.
    reader: what reads P, for the message (e.g. 'spectrum').
  """
  kind = type(config.attention_kind)
  built_in_keys = config.attention == 'full' or kind.keys_and_values is Linformer.keys_and_values
  if config.causal:
    raise ConfigError(
        f'{reader} reads bidirectional attention; this model is causal (model.causal=True).'
    )
  if kind.attend is not AttentionKind.attend or not built_in_keys:
    raise ConfigError(
        f'{reader} reads softmax(Q K^T / sqrt(d)) over the built-in keys; '
        f'attention={config.attention!r} weighs its keys its own way, so use a run of '
        "attention='full' or 'linformer'."
    )


def apply_capturing(module: Any, variables: Any, inputs: jax.Array, padding_mask: jax.Array):
  """`module.apply` in inference mode, capturing Q, K and the E/F projections
  (`capture_intermediates`); returns the captured intermediates."""
  _, state = module.apply(
      variables,
      inputs,
      padding_mask,
      deterministic=True,
      capture_intermediates=capture_intermediates,
      mutable=['intermediates'],
  )
  return state['intermediates']


def captured(intermediates: Mapping[str, Any], path: Sequence[str]) -> Any:
  """The first output of a module captured by `capture_intermediates`."""
  node = intermediates
  for name in path:
    node = node[name]
  return node['__call__'][0]


def context_queries_and_keys(
    intermediates: Mapping[str, Any], config: ModelConfig, padding_mask: jax.Array
) -> List[Tuple[jax.Array, jax.Array, Optional[jax.Array]]]:
  """Per layer, the queries and the keys P is computed over.

  Args:
    intermediates: the 'intermediates' collection of a model.apply that
      captured the 'query' and 'key' projections and the sequence projections
      (see `capture_intermediates`), its encoder under 'encoder'.
    config: the model's config.
    padding_mask: [batch, n], True for real tokens.

  Returns:
    For each layer (q, keys, key_mask): q [batch, n, heads, head_dim]; keys the
    same for full attention, [batch, k, heads, head_dim] for Linformer (E^T K);
    key_mask [batch, keys] of keys that may be attended to, or None for all.
  """
  encoder = intermediates['encoder']
  layers = []
  for layer in range(config.num_layers):
    path = (f'layers_{layer}', 'attention')
    q = captured(encoder, path + ('query',))
    k = captured(encoder, path + ('key',))
    sown = encoder[path[0]][path[1]].get('compressed_keys')
    if sown is not None:  # the layer compressed its input before projecting it
      layers.append((q, *sown[0]))
      continue
    if config.attention == 'full':
      layers.append((q, k, padding_mask))
      continue
    weight = None
    if config.projection_kind.has_weights:
      owner = ('shared_projection',) if config.sharing == 'layerwise' else path + ('projection',)
      weight = captured(encoder, owner)[0]
    keys, key_mask = config.projection_kind.compress(
        k,
        weight,
        max_len=config.max_len,
        projected_len=config.projected_len_for_layer(layer),
        key_padding_mask=padding_mask,
        name='E',
    )
    layers.append((q, keys, key_mask))
  return layers


def attention_matrix(
    q: np.ndarray,
    k: np.ndarray,
    key_padding_mask: Optional[np.ndarray] = None,
    query_padding_mask: Optional[np.ndarray] = None,
) -> np.ndarray:
  """The context-mapping matrix P = softmax(Q K^T / sqrt(d)), in float64.

  Args:
    q: [batch, q_length, heads, head_dim] queries.
    k: [batch, k_length, heads, head_dim] keys (compressed for Linformer).
    key_padding_mask: optional [batch, k_length], True for keys that may be
      attended to; the others get zero weight.
    query_padding_mask: optional [batch, q_length], True for real queries; the
      rows of the others are zero.

  Returns:
    P as float64 [batch, heads, q_length, k_length]; each real query's row sums
    to 1.
  """
  q = np.asarray(q, np.float64)
  k = np.asarray(k, np.float64)
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  if key_padding_mask is not None:
    logits = np.where(
        np.asarray(key_padding_mask)[:, None, None, :], logits, attention.MASKED_LOGIT
    )
  weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  if query_padding_mask is not None:
    weights = np.where(np.asarray(query_padding_mask)[:, None, :, None], weights, 0.0)
  return weights
