"""A sequence projection with weights: every slot a learned convex mix of positions.

Keys and values are compressed by E = softmax over positions of a learned
logit matrix L [max_len, k]: slot j is sum_p E[p, j] x_p, with E[p, j] >= 0 and
the weights of each slot summing to 1 over the real tokens of the sequence.
Unlike 'linear', whose slots can grow with the length and take any sign, a
slot stays inside the hull of the keys it mixes. Registered as 'convex'; train
with it:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/convex \
      --config.extensions="('docs/examples/convex_projection.py',)" \
      --config.model.projection=convex

What a projection with weights must get right, each done below:

1. `weight` declares the weight, a `projections.Parameter` (trained; a fixed
   one would be a `projections.Constant`) with its shape, initialiser and one
   logical axis name per dimension; the model creates it, float32, once per
   weight that `config.model.sharing` asks for (per head and layer, per layer,
   key = value, one for the model) and hands it to `compress` as `weight`.
2. E's layout is [max_len, k], a position per row and a slot per column; with
   `per_head` (sharing='none') it has a leading heads axis, [heads, max_len,
   k], and `compress` must take both.
3. key_padding_mask is True for real tokens. Padding must never enter a slot,
   and a slot holding no real token must come back False in the slot mask
   (the softmax then never attends to it).
4. x may be shorter than max_len (an unpadded batch of short sequences): use
   its first `length` rows of E (`attention.rows_for_length`), never all of them.

Its math is a pure function, `convex_mix`, that the tests check against a
float64 loop, and the model built with it gives an example the same output
alone as batched with longer, padded ones: the checks of `linformer_jax.testing`
(`check_against_reference`, `check_padding_invariance`) that any part's tests run.
"""

import jax
import jax.numpy as jnp

from linformer_jax.model import attention
from linformer_jax.model import logical_axes
from linformer_jax.model import precision
from linformer_jax.model import projections


def convex_mix(x, logits, *, key_padding_mask=None, name='E'):
  """Compresses x [batch, length, heads, head_dim] into k convex mixes.

  Args:
    x: keys or values; length is at most max_len.
    logits: L, [max_len, k] or [heads, max_len, k].
    key_padding_mask: optional [batch, length], True for real tokens.
    name: the weight's name, for error messages.

  Returns:
    [batch, k, heads, head_dim] in x's dtype, slot j being sum_p E[p, j] x_p
    with E = softmax of L's first `length` rows over the real positions; and
    the [batch, k] slot mask, False in a sequence without real tokens (None
    without a padding mask).
  """
  rows = attention.rows_for_length(logits, x.shape[1], name).astype(jnp.float32)
  # [1, heads or 1, length, k]: one matrix per head, or one for every head.
  rows = rows[None] if rows.ndim == 3 else rows[None, None]
  slot_mask = None
  if key_padding_mask is not None:
    rows = jnp.where(key_padding_mask[:, None, :, None], rows, attention.MASKED_LOGIT)
    x = jnp.where(key_padding_mask[:, :, None, None], x, jnp.zeros_like(x))
    slot_mask = jnp.repeat(jnp.any(key_padding_mask, axis=1, keepdims=True), logits.shape[-1], 1)
  weights = jax.nn.softmax(rows, axis=2)  # over positions, in float32
  heads = x.shape[2]
  weights = jnp.broadcast_to(weights, (weights.shape[0], heads) + weights.shape[2:])
  mixed = precision.einsum('bhnk,bnhd->bkhd', weights.astype(x.dtype), x)
  return mixed.astype(x.dtype), slot_mask


@projections.REGISTRY.register('convex')
class ConvexCombination(projections.SequenceProjectionKind):
  """Slots that are learned convex combinations of positions."""

  mixes_positions_linearly = True  # E = softmax(L): `effective_matrix` reads it

  def weight(self, *, config, projected_len, per_head):
    heads = (config.num_heads,) if per_head else ()
    axes = ((logical_axes.PROJECTION_HEADS,) if per_head else ()) + (
        logical_axes.LENGTH,
        logical_axes.PROJECTED_LENGTH,
    )
    return projections.Parameter(
        shape=heads + (config.max_len, projected_len),
        # Random logits: with equal ones every slot would be the same mean,
        # and stay so, as every slot would get the same gradient.
        init=jax.nn.initializers.normal(stddev=1.0),
        axes=axes,
    )

  def compress(self, x, weight, *, max_len, projected_len, key_padding_mask=None, name='E'):
    del max_len, projected_len  # the weight has both
    return convex_mix(x, weight, key_padding_mask=key_padding_mask, name=name)
