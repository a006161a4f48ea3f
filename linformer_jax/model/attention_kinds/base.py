"""What every attention kind declares, and the registry of their names.

An attention kind is how a layer's queries reach its keys and values: full
softmax attention, Linformer's compressed keys and values, or a variant of
one of them. Each is an `AttentionKind` registered under its
`config.model.attention` name; `layers.SelfAttention` holds the dense layers
and the projection weights and calls the kind, which never sees a Flax module.
Before any pass the layer binds its `ModelConfig` to a copy of the kind
(`with_config`), which reads it as `self.config` where a pass takes no config
argument (`attend`).

A kind may also own what a layer learns, holds or a config sets for it:
learned parameters it declares in `parameters(config)` (`Parameter`s), which
`layers.SelfAttention` creates in the layer and hands back as `self.params`
(`with_parameters`); fixed arrays it declares in `constants(config)`
(`Constant`s: random features, say), which the layer draws once at init in
the 'constants' collection, never trained, and hands back as
`self.constant_values` (`with_constants`); and settings of its own
(`settings`, fields of config.model; see `linformer_jax.registry.Setting`),
read with `config.setting(name)`. `Parameter` and `Constant` live in
`linformer_jax.model.declarations`, where sequence projections declare their
weights too, and are importable from here.

A kind serves three passes, each a method:
  bidirectional  `keys_and_values`, then `attend` (per chunk of queries);
  causal         `causal_attention` (config.model.causal, training and scoring);
  decoding       `init_cache` and `decode`, one token per call.
and, for analyses of the bidirectional pass (the spectrum of P, the Python
API's `attention`), `attention_weights`: the matrix P with attend's output
P V, read from the keys and values `keys_and_values` records (`ATTENDED`).
Shapes follow `linformer_jax.model.attention`: q, k, v are [batch, length,
heads, head_dim], padding masks [batch, length], True for real tokens.
"""

import copy
import types
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import precision
from linformer_jax.model.declarations import Constant
from linformer_jax.model.declarations import Parameter
from linformer_jax.model.projections import LayerProjection
from linformer_jax.registry import Registry
from linformer_jax.registry import Setting

Array = jax.Array

# The names `config.model.attention` accepts, each an AttentionKind subclass.
REGISTRY = Registry('config.model.attention', declares_settings=True)
# The name under which `keys_and_values` records (keys, values, key_mask), the
# arguments `attend` receives besides the queries, for analyses.
ATTENDED = 'attended'


class KeyValueDense(NamedTuple):
  """A layer's key and value dense layers, as functions.

  Attributes:
    keys, values: the layer input [batch, length, hidden_dim] to keys or
      values [batch, length, heads, head_dim].
    keys_from_compressed, values_from_compressed: (rows [batch, k, hidden_dim],
      bias_factor float32 [batch, k]) to rows W + bias_factor * b, for a
      projection that compresses the layer input first.
  """

  keys: Callable[[Array], Array]
  values: Callable[[Array], Array]
  keys_from_compressed: Callable[[Array, Array], Array]
  values_from_compressed: Callable[[Array, Array], Array]


class AttentionKind:
  """One kind of attention; see the module docstring.

  Attributes:
    name: the `config.model.attention` value it was chosen by.
    uses_projection: its layers hold sequence projections E and F (so
      config.model.projection, sharing and projected_len apply to it).
    uses_kernel: its `attend` takes config.model.attention_kernel (softmax
      through `attention.attend_with`).
    queries_independent: its `attend` may be called chunk by chunk of queries
      (config.model.inference_chunk); False: always with every query, q then
      aligned with the keys position by position.
    supports_causal: it has a left-to-right form (config.model.causal=True).
    drops_attention_weights: its bidirectional and causal passes apply
      `weight_dropout` to their attention weights; False: it forms no such
      matrix (feature maps) or does not drop it out, and a config with
      model.attention_dropout_rate > 0 is refused for it.
    weight_dropout: the dropout on attention weights in a kind that
      `with_weight_dropout` returned (SelfAttention binds it in training when
      model.attention_dropout_rate > 0); None otherwise (evaluation, decoding).
    settings: the config.model fields it declares (`registry.Setting`).
    params: the values of the parameters `parameters` declares, by name, in
      a kind that `with_parameters` returned (SelfAttention binds them before
      any pass); empty otherwise.
    constant_values: the values of the arrays `constants` declares, by name,
      in a kind that `with_constants` returned (bound as `params` are).
    config: the layer's `ModelConfig` in a kind that `with_config` returned
      (bound as `params` are), for the passes that take no config argument
      (`attend`); None otherwise.
  """

  uses_projection: bool = False
  # Its bidirectional pass attends by softmax over keys through
  # `attention.attend_with`, so model.attention_kernel applies; a kind that
  # computes its own attention (feature maps) sets False, and 'auto' is then
  # the einsums.
  uses_kernel: bool = True
  # Its `attend` treats queries as independent rows, so inference may call it
  # chunk by chunk of queries; a kind whose output for a query depends on the
  # other queries (landmarks, shared hashing) or on the query's position
  # (windows) sets False and always receives the whole sequence.
  queries_independent: bool = True
  supports_causal: bool = True
  # Its passes drop out their attention weights through `weight_dropout`, as
  # `attend` and `attention.attend` do; a kind with its own softmax or none
  # sets False unless it applies `weight_dropout` itself.
  drops_attention_weights: bool = True
  weight_dropout: Optional[attention.WeightDropout] = None
  settings: Tuple[Setting, ...] = ()
  params: Mapping[str, Array] = types.MappingProxyType({})
  constant_values: Mapping[str, Array] = types.MappingProxyType({})
  config: Any = None

  def __init__(self, name: str):
    self.name = name

  def parameters(self, config: Any) -> Dict[str, Parameter]:
    """The learned parameters each layer of this kind holds, by name.

    `layers.SelfAttention` creates them with the layer's other weights (in
    'params': trained, checkpointed and sharded like them, one per layer, and
    stacked by model.scan_layers), then calls the passes on
    `with_parameters(values)`. A name must not be one of the layer's own
    ('query', 'key', 'value', 'out', 'projection').

    Args:
      config: the `ModelConfig` (its sizes and `config.setting(name)`).

    Returns:
      name -> `Parameter`; none by default.
    """
    del config
    return {}

  def with_parameters(self, values: Mapping[str, Array]) -> 'AttentionKind':
    """A copy of this kind whose `params` are `values` (name -> array)."""
    bound = copy.copy(self)
    bound.params = types.MappingProxyType(dict(values))
    return bound

  def constants(self, config: Any) -> Dict[str, Constant]:
    """The fixed arrays each layer of this kind holds, by name.

    `layers.SelfAttention` creates them in the 'constants' collection when
    the model is initialised (one per layer, stacked by model.scan_layers),
    then calls the passes on `with_constants(values)`. A name must be neither
    one of the layer's own nor one of the kind's `parameters`.

    Args:
      config: the `ModelConfig` (its sizes and `config.setting(name)`).

    Returns:
      name -> `Constant`; none by default.
    """
    del config
    return {}

  def with_constants(self, values: Mapping[str, Array]) -> 'AttentionKind':
    """A copy of this kind whose `constant_values` are `values` (name -> array)."""
    bound = copy.copy(self)
    bound.constant_values = types.MappingProxyType(dict(values))
    return bound

  @property
  def decodes(self) -> bool:
    """Whether the kind decodes token by token (defines `init_cache` and `decode`)."""
    return type(self).init_cache is not AttentionKind.init_cache

  def with_config(self, config: Any) -> 'AttentionKind':
    """A copy of this kind whose `config` is `config` (the layer's `ModelConfig`)."""
    bound = copy.copy(self)
    bound.config = config
    return bound

  def with_weight_dropout(self, dropout: Optional[attention.WeightDropout]) -> 'AttentionKind':
    """A copy of this kind whose passes drop out attention weights by `dropout`."""
    bound = copy.copy(self)
    bound.weight_dropout = dropout
    return bound

  def compressed_span(self, config: Any) -> int:
    """The positions one sequence compression covers (max_len by default)."""
    return config.max_len

  def keys_and_values(
      self,
      x: Array,
      padding_mask: Optional[Array],
      dense: KeyValueDense,
      projection: Optional[LayerProjection],
      config: Any,
      *,
      compress_first: bool,
      record: Callable[[str, Any], None],
  ) -> Tuple[Array, Array, Optional[Array]]:
    """The keys and values every query of a bidirectional pass attends over.

    Args:
      x: the layer input [batch, length, hidden_dim].
      padding_mask: optional [batch, length].
      dense: the layer's key and value dense layers.
      projection: the layer's sequence projection (None unless
        `uses_projection`).
      config: the `ModelConfig`.
      compress_first: a projection that can, may compress x before the dense
        layers (False: the reference order, for tests).
      record: stores a named intermediate for analyses (flax's `sow`); a
        kind records what it returns as record(ATTENDED, (keys, values,
        key_mask)), from which analyses read P (`attention_weights`).

    Returns:
      keys and values [batch, kv_length, heads, head_dim] and the
      [batch, kv_length] mask of keys that may be attended to, or None.
    """
    del projection, config, compress_first
    attended = dense.keys(x), dense.values(x), padding_mask
    record(ATTENDED, attended)
    return attended

  def attend(
      self, q: Array, keys: Array, values: Array, key_mask: Optional[Array], *, kernel: str
  ) -> Array:
    """Queries [batch, q_length, heads, head_dim] over `keys_and_values`'s output.

    Queries are independent rows here: inference passes may call this chunk by
    chunk of queries (unless `queries_independent` is False). A kind that needs
    the config here reads `self.config` (see `with_config`).
    """
    return attention.attend_with(kernel, q, keys, values, key_mask, self.weight_dropout)

  def attention_weights(
      self, q: Array, keys: Array, values: Array, key_mask: Optional[Array]
  ) -> Array:
    """The attention weights P that `attend` applies, for analyses.

    `attend(q, keys, values, key_mask, ...)` is P V: out[b, i, h] =
    sum_j P[b, h, i, j] values[b, j, h]. The spectrum and the Python API's
    `attention` read P here, so a kind that overrides `attend` overrides this
    with it (they refuse a kind whose `attend` is defined below its
    `attention_weights`). P is evaluation's: no `weight_dropout`. Forming it
    takes [batch, heads, q_length, kv_length] memory: for analyses at
    moderate lengths, never for training.

    The default is the default `attend`'s: softmax(q keys^T / sqrt(head_dim))
    over the keys key_mask allows (a query that may see none spreads evenly
    over all, as `attention.attend` does).

    Args:
      q: [batch, q_length, heads, head_dim].
      keys, values, key_mask: `keys_and_values`'s output.

    Returns:
      float32 [batch, heads, q_length, kv_length].
    """
    del values  # P does not depend on them
    logits = precision.einsum('bqhd,bkhd->bhqk', q, keys.astype(q.dtype))
    logits = logits / jnp.sqrt(jnp.float32(q.shape[-1]))
    if key_mask is not None:
      logits = jnp.where(key_mask[:, None, None, :], logits, attention.MASKED_LOGIT)
    return jax.nn.softmax(logits, axis=-1)

  def causal_attention(
      self,
      q: Array,
      k: Array,
      v: Array,
      padding_mask: Optional[Array],
      projection: Optional[LayerProjection],
      config: Any,
  ) -> Array:
    """Left-to-right attention of a whole sequence: position t sees s <= t only
    (with `weight_dropout` on its attention weights, where bound)."""
    raise NotImplementedError(f'attention={self.name!r} has no causal form.')

  def init_cache(
      self, batch: int, config: Any, projection: Optional[LayerProjection], dtype
  ) -> Dict[str, Any]:
    """The empty decoding state of one layer: cache variable name -> value."""
    raise NotImplementedError(f'attention={self.name!r} cannot decode token by token.')

  def decode(
      self,
      cache: Dict[str, Any],
      q: Array,
      k: Array,
      v: Array,
      position: Array,
      projection: Optional[LayerProjection],
      config: Any,
  ) -> Tuple[Array, Dict[str, Any]]:
    """Attention of one token [batch, 1, heads, head_dim] at `position`.

    Returns:
      the token's output and the new cache (as `init_cache` makes it).
    """
    raise NotImplementedError(f'attention={self.name!r} cannot decode token by token.')


def kind(attention_name: Any) -> AttentionKind:
  """The kind registered under a name (or the kind itself, when given one).

  Raises:
    ConfigError: a name nobody registered, listing the registered ones.
  """
  if isinstance(attention_name, AttentionKind):
    return attention_name
  return REGISTRY.get(attention_name)(attention_name)
