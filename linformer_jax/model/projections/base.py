"""What every sequence projection declares, and the registry of their names.

A sequence projection compresses keys and values along the sequence axis, from
n positions to k (the paper's E and F). Each kind is a `SequenceProjectionKind`
registered under its `config.model.projection` name; the model asks the kind
for its weights, its compression and its causal (block by block) form, and
never branches on the name. A kind declares its weight (`weight`: a
`Parameter`, trained, or a `Constant`, fixed; see
`linformer_jax.model.declarations`) and the layer creates it: a kind never
sees a Flax module.

Shapes follow `linformer_jax.model.attention`: x is [batch, length, heads,
head_dim] and key_padding_mask [batch, length], True for real tokens.
"""

from typing import Any, NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp

from linformer_jax.errors import ConfigError
from linformer_jax.model.declarations import Constant
from linformer_jax.model.declarations import Parameter
from linformer_jax.registry import Registry
from linformer_jax.registry import Setting

Array = jax.Array
# What `SequenceProjectionKind.weight` declares.
Declared = Union[Parameter, Constant]

# The names `config.model.projection` accepts, each a SequenceProjectionKind subclass.
REGISTRY = Registry('config.model.projection', declares_settings=True)


class SequenceProjectionKind:
  """One kind of sequence projection: its weights and how it compresses.

  A subclass sets the class attributes that apply and overrides `compress`
  (always), `weight` (when it holds weights; the layer checks that the
  declared shape is `weight_shape`'s, E's [max_len, k] unless overridden)
  and `compress_layer_input` (when `compresses_first`). The causal Linformer's
  `block_summaries` works unchanged for a windowed kind; others override it
  (or cannot be causal).

  Attributes:
    name: the `config.model.projection` value it was chosen by.
    compresses_first: compressing commutes with the key/value dense layers,
      so a layer whose heads share E and F may compress its input first and
      project k rows instead of n (`compress_layer_input`).
    windowed: it compresses windows of span / k consecutive positions (window
      = stride), so the span (max_len, or block_len when causal) must be a
      multiple of k.
    weight_ndim: the axes of one weight, without the leading heads axis a
      per-head weight (sharing='none') has.
    projection_inits: the `config.model.projection_init` values it takes;
      'jl', the default, leaves a kind's own initialisation.
    default_projection_init: what `projection_init=''` (configs/default.py's
      value) means for this kind; the first of `projection_inits` unless set.
    settings: the config.model fields it declares (`registry.Setting`),
      read with `config.setting(name)`.
    mixes_positions_linearly: `compress` is, in every head, x -> E^T x for a
      matrix E over positions that x does not change (features untouched):
      then `effective_matrix` reads E off the kind itself. Max pooling and a
      convolution mixing features are not.
  """

  compresses_first: bool = False
  windowed: bool = False
  weight_ndim: int = 2
  projection_inits: Tuple[str, ...] = ('jl',)
  settings: Tuple[Setting, ...] = ()
  mixes_positions_linearly: bool = False

  @property
  def default_projection_init(self) -> str:
    return self.projection_inits[0]

  def __init__(self, name: str):
    self.name = name
    if hasattr(self, 'make_weight'):
      # A kind written for the versions that handed it the Flax module.
      raise ConfigError(
          f'projection={name!r}: {type(self).__name__} defines make_weight, which is no longer '
          'called; declare its weight with weight(self, *, config, projected_len, per_head), '
          'returning a Parameter or a Constant (docs/extending.md, "A projection with weights").'
      )

  @property
  def has_weights(self) -> bool:
    """Whether it holds weights: it defines its own `weight`."""
    return type(self).weight is not SequenceProjectionKind.weight

  @property
  def supports_causal(self) -> bool:
    """Whether `block_summaries` works: a windowed kind, or one defining its own."""
    own = type(self).block_summaries is not SequenceProjectionKind.block_summaries
    return self.windowed or own

  def weight(self, *, config: Any, projected_len: int, per_head: bool) -> Optional[Declared]:
    """The weight (E or F) the kind holds, for the layer to create.

    The layer creates it, float32, once per weight that `config.model.sharing`
    asks for (named 'kv_projection', or 'key_projection' and
    'value_projection'): a `Parameter` in 'params', trained with the
    encoder's other weights (at config.model.projection_learning_rate_scale,
    so it keeps the default learning_rate_scale and weight_decay), or a
    `Constant` in the 'constants' collection, drawn once and never trained.
    It hands the value to `compress` as `weight`.

    `docs/examples/convex_projection.py` is a kind with weights, and says what
    one must get right: the weight's [(heads,) max_len, k] layout, the mask's
    polarity (True = real token) and inputs shorter than max_len.

    Args:
      config: the `ModelConfig`.
      projected_len: k of the layer(s) using the weight.
      per_head: one weight per head, with a leading heads axis.

    Returns:
      Its declaration, of `weight_shape`'s shape, with one logical axis name
      per dimension; None for a kind without weights (the default).
    """
    del config, projected_len, per_head
    return None

  def weight_shape(self, *, config: Any, projected_len: int, per_head: bool) -> Tuple[int, ...]:
    """The shape `weight` must declare: E's layout, [max_len, k] (a position
    per row, a slot per column), after a heads axis for a per-head weight. A
    kind whose weights are no such matrix (the 'conv' kernels) overrides it."""
    heads = (config.num_heads,) if per_head else ()
    return heads + (config.max_len, projected_len)

  def check_weight(
      self,
      declared: Optional[Declared],
      name: str,
      *,
      config: Any,
      projected_len: int,
      per_head: bool,
  ) -> Optional[Declared]:
    """The weight `weight` declared, once the layer may create it.

    Raises:
      ConfigError: a declaration of another shape than `weight_shape`'s,
        naming the kind, the weight, the shape it has and the one expected;
        neither a `Parameter` nor a `Constant`; or a `Parameter` with its own
        learning_rate_scale or weight_decay, which the optimizer gives an
        attention kind's parameters only.
    """
    if declared is None:
      return None
    if not isinstance(declared, (Parameter, Constant)):
      raise ConfigError(
          f'projection={self.name!r}: weight() declared {name} as {type(declared).__name__}; '
          'return a Parameter (trained), a Constant (fixed) or None (no weights).'
      )
    expected = self.weight_shape(config=config, projected_len=projected_len, per_head=per_head)
    if tuple(declared.shape) != tuple(expected):
      layout = ('[heads, max_len, k]' if per_head else '[max_len, k]') + f' = {tuple(expected)}'
      if type(self).weight_shape is not SequenceProjectionKind.weight_shape:
        layout = f'{tuple(expected)} (its weight_shape)'
      raise ConfigError(
          f'projection={self.name!r}: weight() declared {name} with the shape '
          f'{tuple(declared.shape)}, not {layout}; declare it in that layout, or override '
          'weight_shape for a weight that is no E (docs/extending.md).'
      )
    if isinstance(declared, Parameter) and (
        declared.learning_rate_scale != 1.0 or declared.weight_decay is not None
    ):
      raise ConfigError(
          f'projection={self.name!r}: weight() declared {name} with learning_rate_scale='
          f'{declared.learning_rate_scale!r}, weight_decay={declared.weight_decay!r}; leave both '
          "at their defaults: a projection's weights learn at "
          "config.model.projection_learning_rate_scale, decayed by the optimizer's rule."
      )
    return declared

  def compress(
      self,
      x: Array,
      weight: Optional[Array],
      *,
      max_len: int,
      projected_len: int,
      key_padding_mask: Optional[Array] = None,
      name: str = 'E',
  ) -> Tuple[Array, Optional[Array]]:
    """Compresses x [batch, length, heads, head_dim] to projected_len positions.

    Args:
      x: keys or values; length is at most max_len.
      weight: the kind's weight (E or F), or None.
      max_len: the span n that projected_len positions summarise.
      projected_len: k.
      key_padding_mask: optional [batch, length]; padding must never enter the
        result.
      name: the weight's name, for error messages.

    Returns:
      [batch, projected_len, heads, head_dim] in x's dtype, and a
      [batch, projected_len] mask, False for positions holding no real token
      (None when every position does).
    """
    raise NotImplementedError(f'projection={self.name!r} does not define compress.')

  def effective_matrix(
      self,
      weight: Optional[Array],
      *,
      max_len: int,
      projected_len: int,
      length: Optional[int] = None,
      padding_mask: Optional[Array] = None,
  ) -> Optional[Array]:
    """E as the kind applies it to one sequence, for analyses (projection_stats).

    The default, for a kind that `mixes_positions_linearly`, compresses the
    one-hot positions of a sequence (position p's features are e_p), so slot
    j comes back as column j of E. A kind whose E has a closed form may
    override it; one that is no fixed mix of positions returns None, and the
    analyses that need E refuse it.

    Args:
      weight: one weight as the layer created it (or None).
      max_len: the span n that projected_len positions summarise.
      projected_len: k.
      length: the sequence's length, max_len by default.
      padding_mask: optional [length], True for real tokens.

    Returns:
      float32 [length, k], or [heads, length, k] for a per-head weight, with
      slot j = sum_p E[p, j] x_p and zero rows at padding; None when the kind
      has no such matrix.
    """
    if not self.mixes_positions_linearly:
      return None
    length = max_len if length is None else length
    per_head = weight is not None and weight.ndim == self.weight_ndim + 1
    heads = weight.shape[0] if per_head else 1
    one_hot = jnp.broadcast_to(
        jnp.eye(length, dtype=jnp.float32)[None, :, None, :], (1, length, heads, length)
    )
    mask = None if padding_mask is None else jnp.asarray(padding_mask, bool)[None]
    compressed, _ = self.compress(
        one_hot, weight, max_len=max_len, projected_len=projected_len, key_padding_mask=mask
    )
    matrices = jnp.transpose(compressed[0].astype(jnp.float32), (1, 2, 0))  # [heads, length, k]
    return matrices if per_head else matrices[0]

  def compress_layer_input(
      self,
      x: Array,
      weight: Optional[Array],
      *,
      max_len: int,
      projected_len: int,
      key_padding_mask: Optional[Array] = None,
      name: str = 'E',
  ) -> Tuple[Array, Array, Optional[Array]]:
    """Compresses a layer's input [batch, length, features] before the key or
    value dense layer (only for `compresses_first` kinds).

    Returns:
      The compressed input [batch, k, features] in x's dtype; the float32
      [batch, k] factor each compressed row's dense bias takes; and the
      [batch, k] mask of rows holding real tokens, or None.
    """
    raise NotImplementedError(f'projection={self.name!r} cannot compress a layer input.')

  def check_blocks(self, weight: Optional[Array], block: int, slots: int) -> None:
    """Raises a ValueError for a block size or slot count the kind cannot use."""
    del weight
    if self.windowed and block % slots:
      raise ValueError(f'slots={slots} must divide block={block} for {self.name!r} windows.')

  def block_summaries(
      self,
      x: Array,
      weight: Optional[Array],
      *,
      block: int,
      slots: int,
      key_padding_mask: Array,
      name: str = 'E',
  ) -> Tuple[Array, Array]:
    """Compresses each block of x into `slots` summaries (causal Linformer).

    Args:
      x: [batch, num_blocks * block, heads, head_dim], already padded to whole
        blocks.
      weight: the kind's weight, as in `compress`.
      block, slots: b and r.
      key_padding_mask: [batch, num_blocks * block], True for real tokens.
      name: the weight's name, for error messages.

    Returns:
      [batch, num_blocks * slots, heads, head_dim] (slot s summarises block
      s // slots) and its mask, False for slots holding no real token.
    """
    if not self.windowed:
      raise NotImplementedError(f'projection={self.name!r} has no causal (block by block) form.')
    # Windows of block / slots positions never cross a block boundary.
    length = x.shape[1]
    summaries, mask = self.compress(
        x,
        weight,
        max_len=length,
        projected_len=length // block * slots,
        key_padding_mask=key_padding_mask,
        name=name,
    )
    if mask is None:
      mask = jnp.ones(summaries.shape[:2], bool)
    return summaries, mask

  def check_decode_len(self, weight: Optional[Array], max_len: int) -> None:
    """Raises a ValueError when the weight cannot decode up to max_len tokens."""
    del weight, max_len

  def weight_for_block(self, weight: Optional[Array], block_index: Array, block: int):
    """The part of the weight that compresses block `block_index` alone (decoding)."""
    del block_index, block
    return weight


class LayerProjection(NamedTuple):
  """A layer's sequence projection, as its attention uses it.

  Attributes:
    kind: the projection kind.
    projected_len: the layer's k (slots per block when causal).
    key_weight, value_weight: E and F (the same array when shared), or None.
  """

  kind: SequenceProjectionKind
  projected_len: int
  key_weight: Optional[Array]
  value_weight: Optional[Array]


def kind(projection: Any) -> SequenceProjectionKind:
  """The kind registered under a name (or the kind itself, when given one).

  Raises:
    ValueError: a name nobody registered, listing the registered ones.
  """
  if isinstance(projection, SequenceProjectionKind):
    return projection
  if projection not in REGISTRY:
    raise ValueError(
        f'projection={projection!r} is unknown; use one of {REGISTRY.names()} or register '
        'your own (config.extensions).'
    )
  return REGISTRY.get(projection)(projection)
