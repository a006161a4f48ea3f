"""What each layer attends with, read from a forward pass: queries, keys, P.

Analyses (the spectrum of P, the pooling probe) and the Python API's
`attention` read a layer's queries, the keys and values they attend over and
the attention weights P without a second copy of the model's code. A pass
with Flax's `capture_intermediates` (filter `capture_intermediates` below)
records the 'query' dense layer's output, and each layer's kind records the
keys, values and key mask its `attend` receives (`keys_and_values`, under
`attention_kinds.ATTENDED`); `attended_by_layer` reads both, per layer.

P is the kind's own (`AttentionKind.attention_weights`, the matrix whose
product with the values is the layer's attention): `layer_attention_weights`
computes it with the layer's values of the kind's parameters and constants.
A kind that keeps the default, softmax(Q K^T / sqrt(d)) (full attention, the
Linformer over its k compressed keys), has it computed in float64 from Q and K
(`attention_matrix`). `require_attention_weights` refuses a causal model, and
a kind that overrides `attend` without saying how it weighs its keys.

The layers are found by name (layers_0, layers_1, ...) under the model's
'encoder': a model with scanned layers has none (`ModelConfig.require_unscanned`).
"""

import functools
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.model.attention_kinds.base import ATTENDED
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.layers import SequenceProjection
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.model.projections import CONSTANTS


def capture_intermediates(module: Any, method_name: str) -> bool:
  """Filter for flax's capture_intermediates: Q (`attended_by_layer`), and K
  and the E/F projections, for readers of the raw keys and weights (the
  pooling probe's F)."""
  return method_name == '__call__' and (
      module.name in ('query', 'key') or isinstance(module, SequenceProjection)
  )


def _require_bidirectional(config: ModelConfig, reader: str) -> None:
  if config.causal:
    raise ConfigError(
        f'{reader} reads bidirectional attention; this model is causal (model.causal=True).'
    )


def _definer(kind_class: type, method: str) -> type:
  """The class of kind_class's method resolution order that defines `method`."""
  return next(owner for owner in kind_class.__mro__ if method in vars(owner))


def require_attention_weights(config: ModelConfig, reader: str) -> None:
  """A ConfigError unless P of each layer is known: a bidirectional model
  whose kind defines `attention_weights` where it defines `attend` or below
  (the default's for the default `attend`). A kind that overrides `attend`
  alone would get a P it never used.

  Args:
    config: the model's config.
    reader: what reads P, for the message (e.g. 'spectrum').
  """
  _require_bidirectional(config, reader)
  kind = type(config.attention_kind)
  attend_owner = _definer(kind, 'attend')
  if not issubclass(_definer(kind, 'attention_weights'), attend_owner):
    raise ConfigError(
        f'{reader} reads the attention weights P of each layer; attention={config.attention!r} '
        f'weighs its keys its own way ({attend_owner.__name__} overrides attend) and does not '
        'say how: define attention_weights beside its attend (docs/extending.md).'
    )


def require_plain_softmax(config: ModelConfig, reader: str) -> None:
  """A ConfigError unless each layer of the model attends as `attention_matrix`
  computes: bidirectional, with softmax(Q K^T / sqrt(d)) over the keys its kind
  records. A kind that changes it (a temperature, a scale, attention of its
  own) or a causal model would get a P it never used; readers of the kind's
  own P use `require_attention_weights` and `layer_attention_weights`.

  Args:
    config: the model's config.
    reader: what reads P, for the message (e.g. 'pooling_probe').
  """
  _require_bidirectional(config, reader)
  if not _weighs_by_default(config):
    raise ConfigError(
        f'{reader} reads softmax(Q K^T / sqrt(d)) over the built-in keys; '
        f'attention={config.attention!r} weighs its keys its own way, so use a run of '
        "attention='full' or 'linformer'."
    )


def _weighs_by_default(config: ModelConfig) -> bool:
  """Whether the kind's P is the default softmax(Q K^T / sqrt(d))."""
  kind = type(config.attention_kind)
  return (
      kind.attend is AttentionKind.attend
      and kind.attention_weights is AttentionKind.attention_weights
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


class Attended(NamedTuple):
  """What one layer's queries attend over, as its kind's `attend` receives it.

  Attributes:
    queries: [batch, n, heads, head_dim].
    keys, values: [batch, kv_length, heads, head_dim]: the n keys for full
      attention, the k compressed ones (E^T K, F^T V) for the Linformer, the
      kind's own otherwise.
    key_mask: [batch, kv_length], True for keys that may be attended to, or
      None for all.
  """

  queries: jax.Array
  keys: jax.Array
  values: jax.Array
  key_mask: Optional[jax.Array]


def attended_by_layer(intermediates: Mapping[str, Any], config: ModelConfig) -> List[Attended]:
  """Per layer, the queries and what they attend over.

  Args:
    intermediates: the 'intermediates' collection of a model.apply that
      captured the 'query' projections (see `capture_intermediates`) and let
      the kinds record (mutable 'intermediates'), its encoder under 'encoder'.
    config: the model's config.

  Raises:
    ConfigError: a kind whose `keys_and_values` records nothing.
  """
  encoder = intermediates['encoder']
  layers = []
  for layer in range(config.num_layers):
    path = (f'layers_{layer}', 'attention')
    recorded = encoder[path[0]][path[1]].get(ATTENDED)
    if recorded is None:
      raise ConfigError(
          f'attention={config.attention!r} records nothing for analyses: its keys_and_values '
          f'must call record({ATTENDED!r}, (keys, values, key_mask)) before returning them.'
      )
    layers.append(Attended(captured(encoder, path + ('query',)), *recorded[0]))
  return layers


def context_queries_and_keys(
    intermediates: Mapping[str, Any], config: ModelConfig, padding_mask: jax.Array
) -> List[Tuple[jax.Array, jax.Array, Optional[jax.Array]]]:
  """Per layer (q, keys, key_mask) of `attended_by_layer`, for the readers
  of softmax(Q K^T / sqrt(d)) (`attention_matrix`); padding_mask, the
  tokens' [batch, n] mask, is the one the kinds recorded theirs from."""
  del padding_mask  # each kind records its key mask
  return [(a.queries, a.keys, a.key_mask) for a in attended_by_layer(intermediates, config)]


def layer_parameters(
    variables: Mapping[str, Any], config: ModelConfig, layer: int
) -> Tuple[Dict[str, jax.Array], Dict[str, jax.Array]]:
  """One layer's values of the parameters and constants its kind declares
  (`AttentionKind.parameters`, `constants`), by name.

  Args:
    variables: the model's variables ('params', 'constants'), its encoder
      under 'encoder'.
    config: the model's config.
    layer: the layer, 0 to num_layers - 1.
  """
  kind = config.attention_kind

  def values(collection: str, declared: Mapping[str, Any]) -> Dict[str, jax.Array]:
    if not declared:
      return {}
    held = variables[collection]['encoder'][f'layers_{layer}']['attention']
    return {name: nn.meta.unbox(held[name]) for name in declared}

  return values('params', kind.parameters(config)), values(CONSTANTS, kind.constants(config))


@functools.partial(jax.jit, static_argnums=0)
def _kind_weights(config: ModelConfig, params, constants, attended: Attended) -> jax.Array:
  kind = config.attention_kind.with_config(config).with_parameters(params)
  return kind.with_constants(constants).attention_weights(*attended)


def layer_attention_weights(
    variables: Mapping[str, Any],
    config: ModelConfig,
    layer: int,
    attended: Attended,
    query_padding_mask: Optional[np.ndarray] = None,
) -> np.ndarray:
  """One layer's attention weights P, as its kind applies them, in float64.

  The kind's `attention_weights` with the layer's parameters and constants
  bound as the layer binds them (float32, promoted); for the default
  softmax(Q K^T / sqrt(d)), `attention_matrix` in float64. Callers check the
  model first (`require_attention_weights`).

  Args:
    variables: the model's variables, its encoder under 'encoder'.
    config: the model's config.
    layer: the layer, 0 to num_layers - 1.
    attended: the layer's `Attended`, from `attended_by_layer` (any batch).
    query_padding_mask: optional [batch, n], True for real queries; the rows
      of the others are zero.

  Returns:
    float64 [batch, heads, n, kv_length], with P V the layer's attention.
  """
  if _weighs_by_default(config):
    return attention_matrix(
        np.asarray(attended.queries),
        np.asarray(attended.keys),
        attended.key_mask,
        query_padding_mask,
    )
  params, constants = layer_parameters(variables, config, layer)
  weights = np.asarray(_kind_weights(config, params, constants, attended), np.float64)
  if query_padding_mask is not None:
    weights = np.where(np.asarray(query_padding_mask)[:, None, :, None], weights, 0.0)
  return weights


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
