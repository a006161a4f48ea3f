"""Matrix products in the compute dtype, accumulated in float32.

Under `model.dtype='bfloat16'` every matrix product of the model should take
bfloat16 operands (an accelerator's matrix units run them at full rate, and
they move half the bytes), while sums that precision needs (attention logits
before the softmax, sums over thousands of positions) accumulate and come out
in float32.

`jnp.einsum(..., preferred_element_type=float32)` does the forward half. Its
gradient does not: the float32 result's cotangent is float32, so JAX's
transposed products multiply it by the other (bfloat16) operand upcast to
float32, and the backward pass, two thirds of a training step's matrix FLOPs,
runs in float32. `einsum` below keeps the forward product and computes the
gradients from the cotangent rounded to the operands' dtype, as the backward
pass of a bfloat16 dense layer does, so every product of the step takes
bfloat16 operands. With float32 operands it is exactly `jnp.einsum` with
float32 results.
"""

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def einsum(equation: str, x: Array, y: Array) -> Array:
  """`jnp.einsum(equation, x, y)` in float32 from operands of one dtype.

  Args:
    equation: an einsum equation of two operands.
    x, y: operands of the same dtype (cast a float32 parameter to the other
      operand's dtype first).

  Returns:
    The product, accumulated and returned in float32.
  """
  if x.dtype != y.dtype:
    raise ValueError(
        f'precision.einsum({equation!r}) takes operands of one dtype; got {x.dtype} and '
        f'{y.dtype}: cast the parameter to the activation dtype first.'
    )
  return jnp.einsum(equation, x, y, preferred_element_type=jnp.float32)


def _einsum_forward(equation, x, y):
  return einsum(equation, x, y), (x, y)


def _einsum_backward(equation, operands, cotangent):
  x, y = operands
  _, transpose = jax.vjp(functools.partial(jnp.einsum, equation), x, y)
  return transpose(cotangent.astype(x.dtype))


einsum.defvjp(_einsum_forward, _einsum_backward)
