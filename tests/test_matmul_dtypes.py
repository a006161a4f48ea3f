"""bfloat16 matrix products: the FLOP count by dtype, and the train step's share.

`dot_flops` is checked on a program whose products are counted by hand;
`precision.einsum` against `jnp.einsum` and a float64 reference; and the train
step of configs/roberta_base.py (2 layers) in bfloat16 must run at least 99%
of its matrix FLOPs on bfloat16 operands, forward and backward, for the
Linformer and the Transformer at n=512/k=128 and n=4096/k=256.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import roberta_base
from linformer_jax.matmul_dtypes import dot_flops
from linformer_jax.matmul_dtypes import train_step_matmul_dtypes
from linformer_jax.model import models
from linformer_jax.model import precision
from linformer_jax.model.model_config import ModelConfig


def test_flops_are_counted_by_type_and_once_per_call():
  @jax.jit
  def small(c, d):
    return c @ d

  def program(a, b, c, d):
    return (a @ b).sum() + small(c, d).sum() + small(c + 1, d).sum()

  args = (
      jnp.ones((4, 8), jnp.bfloat16),
      jnp.ones((8, 16), jnp.bfloat16),
      jnp.ones((2, 3), jnp.float32),
      jnp.ones((3, 5), jnp.float32),
  )
  text = jax.jit(program).lower(*args).as_text()
  assert 'call @small' in text  # one function, called twice
  assert dot_flops(text) == {
      ('bf16', 'bf16', 'bf16'): 2 * 4 * 16 * 8,
      ('f32', 'f32', 'f32'): 2 * (2 * 2 * 5 * 3),
  }


def test_batched_products_count_their_batch_axes():
  a, b = jnp.ones((3, 4, 6), jnp.float32), jnp.ones((3, 6, 5), jnp.float32)
  text = jax.jit(lambda a, b: jnp.einsum('bij,bjk->bik', a, b)).lower(a, b).as_text()
  assert dot_flops(text) == {('f32', 'f32', 'f32'): 2 * 3 * 4 * 5 * 6}


def test_precision_einsum_is_einsum_in_float32():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 3))
  y = jax.random.normal(jax.random.PRNGKey(1), (3, 4))

  def loss(einsum, x, y):
    return jnp.sum(jnp.sin(einsum('bnd,dk->bnk', x, y)))

  ours = jax.value_and_grad(lambda x, y: loss(precision.einsum, x, y), argnums=(0, 1))(x, y)
  plain = jax.value_and_grad(lambda x, y: loss(jnp.einsum, x, y), argnums=(0, 1))(x, y)
  jax.tree_util.tree_map(np.testing.assert_array_equal, ours, plain)


def test_precision_einsum_in_bfloat16_accumulates_in_float32_and_keeps_bf16_gradients():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 64, 8)).astype(jnp.bfloat16)
  y = jax.random.normal(jax.random.PRNGKey(1), (8, 64)).astype(jnp.bfloat16)
  out, transpose = jax.vjp(lambda x, y: precision.einsum('bnd,dk->bnk', x, y), x, y)
  assert out.dtype == jnp.float32
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
  np.testing.assert_allclose(out, np.einsum('bnd,dk->bnk', x64, y64), rtol=1e-5, atol=1e-5)
  cotangent = jax.random.normal(jax.random.PRNGKey(2), out.shape)
  grad_x, grad_y = transpose(cotangent)
  assert grad_x.dtype == grad_y.dtype == jnp.bfloat16
  # The cotangent is rounded to bfloat16, then each gradient to bfloat16.
  g64 = np.asarray(cotangent.astype(jnp.bfloat16), np.float64)
  for grad, expected in (
      (grad_x, np.einsum('bnk,dk->bnd', g64, y64)),
      (grad_y, np.einsum('bnk,bnd->dk', g64, x64)),
  ):
    np.testing.assert_allclose(np.asarray(grad, np.float64), expected, rtol=2e-2, atol=2e-2)


def test_operands_of_two_dtypes_are_refused():
  with pytest.raises(ValueError, match='cast the parameter'):
    precision.einsum('ij,jk->ik', jnp.ones((2, 2), jnp.bfloat16), jnp.ones((2, 2)))


def roberta_step(attention, max_len, projected_len, dtype='bfloat16'):
  config = roberta_base.get_config()
  config.model.attention = attention
  config.model.num_layers = 2
  config.model.max_len = max_len
  config.model.projected_len = projected_len
  config.model.dtype = dtype
  config.batch_size = 8
  return train_step_matmul_dtypes(config)


@pytest.mark.parametrize('attention', ['linformer', 'full'])
@pytest.mark.parametrize('max_len,projected_len', [(512, 128), (4096, 256)])
def test_the_bf16_train_step_runs_its_matmuls_on_bf16_operands(attention, max_len, projected_len):
  counted = roberta_step(attention, max_len, projected_len)
  assert counted.share_with_operands('bf16') >= 0.99, counted.flops
  # Forward and backward of every layer are counted: 3x a forward pass at least.
  layer_forward = 2 * 8 * max_len * (4 * 768 * 768 + 2 * 768 * 3072)
  assert counted.total > 3 * 2 * layer_forward


def test_a_float32_step_stays_float32():
  counted = roberta_step('linformer', 512, 128, dtype='float32')
  assert counted.share_with_operands('f32') == 1.0


def test_a_frequent_tokens_embedding_gradient_is_summed_in_float32():
  # The mask token fills ~12% of a batch: its row's gradient sums thousands of
  # terms. Gathered from the float32 table, they add in float32, as the float64
  # reference does; a bfloat16 table's scatter-add would round the sum (2**-9).
  config = ModelConfig(
      vocab_size=16,
      max_len=4096,
      hidden_dim=8,
      num_layers=1,
      num_heads=2,
      mlp_dim=16,
      projected_len=8,
      dtype='bfloat16',
  )
  encoder = models.Encoder(config)
  tokens = jnp.full((1, 4096), 3, jnp.int32).at[0, ::7].set(5)
  params = nn.meta.unbox(encoder.init(jax.random.PRNGKey(0), tokens[:, :8]))['params']
  cotangent = jax.random.normal(jax.random.PRNGKey(1), (1, 4096, 8))

  def loss(params):
    rows = encoder.apply({'params': params}, tokens, method=models.Encoder.embed_tokens)
    assert rows.dtype == jnp.bfloat16
    return jnp.sum(rows.astype(jnp.float32) * cotangent)

  grad = jax.grad(loss)(params)['token_embedding']['embedding']
  assert grad.dtype == jnp.float32
  terms = np.asarray(cotangent.astype(jnp.bfloat16), np.float64)[0]
  for token in (3, 5):
    expected = terms[np.asarray(tokens[0]) == token].sum(axis=0)
    np.testing.assert_allclose(np.asarray(grad[token], np.float64), expected, rtol=1e-5, atol=1e-5)
