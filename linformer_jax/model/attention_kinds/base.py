"""What every attention kind declares, and the registry of their names.

An attention kind is how a layer's queries reach its keys and values: full
softmax attention, Linformer's compressed keys and values, or a variant of
one of them. Each is an `AttentionKind` registered under its
`config.model.attention` name; `layers.SelfAttention` holds the dense layers
and the projection weights and calls the kind, which never sees a Flax module.

A kind serves three passes, each a method:
  bidirectional  `keys_and_values`, then `attend` (per chunk of queries);
  causal         `causal_attention` (config.model.causal, training and scoring);
  decoding       `init_cache` and `decode`, one token per call.
Shapes follow `linformer_jax.model.attention`: q, k, v are [batch, length,
heads, head_dim], padding masks [batch, length], True for real tokens.
"""

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax

from linformer_jax.model import attention
from linformer_jax.model.projections import LayerProjection
from linformer_jax.registry import Registry

Array = jax.Array

# The names `config.model.attention` accepts, each an AttentionKind subclass.
REGISTRY = Registry('config.model.attention')


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
    supports_causal: it has a left-to-right form (config.model.causal=True).
  """

  uses_projection: bool = False
  supports_causal: bool = True

  def __init__(self, name: str):
    self.name = name

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
      record: stores a named intermediate for analyses (flax's `sow`).

    Returns:
      keys and values [batch, kv_length, heads, head_dim] and the
      [batch, kv_length] mask of keys that may be attended to, or None.
    """
    del projection, config, compress_first, record
    return dense.keys(x), dense.values(x), padding_mask

  def attend(
      self, q: Array, keys: Array, values: Array, key_mask: Optional[Array], *, kernel: str
  ) -> Array:
    """Queries [batch, q_length, heads, head_dim] over `keys_and_values`'s output.

    Queries are independent rows here: inference passes may call this chunk by
    chunk of queries.
    """
    return attention.attend_with(kernel, q, keys, values, key_mask)

  def causal_attention(
      self,
      q: Array,
      k: Array,
      v: Array,
      padding_mask: Optional[Array],
      projection: Optional[LayerProjection],
      config: Any,
  ) -> Array:
    """Left-to-right attention of a whole sequence: position t sees s <= t only."""
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
