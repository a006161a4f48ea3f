"""RoBERTa's three dropouts: where each one acts, what each one leaves alone.

`dropout_rate` acts on the embeddings and the residual branches,
`attention_dropout_rate` on the attention weights P ([n, k] for a Linformer,
[n, n] for the Transformer), `activation_dropout_rate` on the MLP's hidden
(0 by default). Checked against a float64 reference of dropped-out attention,
by recording the arrays the dropout reaches, and by comparing training passes
with evaluation passes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.model import models
from linformer_jax.model.attention_kinds import causal_linformer
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_config

N, K = 32, 8
SMALL = dict(
    vocab_size=40,
    max_len=N,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    mlp_dim=32,
    projected_len=K,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def qkv(seed, batch=2, length=N, heads=2, head_dim=4):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(jax.random.normal(key, (batch, length, heads, head_dim)) for key in keys)


def test_attention_dropout_matches_a_float64_reference():
  q, k, v = qkv(0)
  mask = jnp.arange(N)[None, :] < jnp.array([[N], [20]])
  dropout = attention.WeightDropout(0.3, jax.random.PRNGKey(7))
  actual = attention.attend(q, k, v, mask, dropout)
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('bqhd,bkhd->bhqk', q64, k64) / np.sqrt(q.shape[-1])
  logits = np.where(np.asarray(mask)[:, None, None, :], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  keep = np.asarray(jax.random.bernoulli(dropout.key, 0.7, weights.shape))
  expected = np.einsum('bhqk,bkhd->bqhd', weights * keep / 0.7, v64)
  np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
  # Unbiased: averaged over many keys, dropped-out attention is attention.
  keys = jax.random.split(jax.random.PRNGKey(8), 4000)
  drawn = jax.vmap(lambda key: attention.attend(q, k, v, mask, dropout._replace(key=key)))(keys)
  plain = attention.attend(q, k, v, mask)
  assert np.abs(np.asarray(drawn.mean(0)) - np.asarray(plain)).max() < 0.05


def recorded_dropouts(monkeypatch, config, deterministic=False):
  """The shapes of the arrays each kind of dropout reaches in one training
  pass of a masked LM: {'weights': [...], 'hidden': [...]}."""
  seen = {'weights': [], 'hidden': []}
  apply_weights = attention.WeightDropout.apply

  def record_weights(self, weights):
    seen['weights'].append(weights.shape)
    return apply_weights(self, weights)

  monkeypatch.setattr(attention.WeightDropout, 'apply', record_weights)
  model = models.MaskedLanguageModel(config)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N), 0, config.vocab_size)
  variables = model.init(jax.random.PRNGKey(0), tokens)

  def record_hidden(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dropout) and context.module.rate > 0:
      seen['hidden'].append(args[0].shape)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record_hidden):
    model.apply(
        variables, tokens, deterministic=deterministic, rngs={'dropout': jax.random.PRNGKey(2)}
    )
  return seen


@pytest.mark.parametrize('attention_name,keys', [('linformer', K), ('full', N)])
def test_attention_dropout_reaches_the_attention_weights(monkeypatch, attention_name, keys):
  config = ModelConfig(**{**SMALL, 'attention': attention_name, 'attention_dropout_rate': 0.1})
  seen = recorded_dropouts(monkeypatch, config)
  # Once per layer, on P [batch, heads, n, k] (Linformer) or [batch, heads, n, n].
  assert seen['weights'] == [(2, 2, N, keys)] * 2
  assert seen['hidden'] == []
  assert recorded_dropouts(monkeypatch, config, deterministic=True)['weights'] == []


def test_roberta_defaults_leave_the_mlp_hidden_alone(monkeypatch):
  defaults = {name: value for name, value in SMALL.items() if 'dropout' not in name}
  config = ModelConfig(**defaults)
  assert (config.dropout_rate, config.attention_dropout_rate) == (0.1, 0.1)
  assert config.activation_dropout_rate == 0.0
  seen = recorded_dropouts(monkeypatch, config)
  # The embeddings, then per layer the attention output and the MLP output, all
  # [batch, n, hidden]; nothing of the MLP's width (32).
  assert seen['hidden'] == [(2, N, 16)] * 5
  assert len(seen['weights']) == 2
  activation = recorded_dropouts(
      monkeypatch, ModelConfig(**{**SMALL, 'activation_dropout_rate': 0.1})
  )
  assert activation['hidden'] == [(2, N, 32)] * 2


def test_without_dropout_a_training_pass_is_an_evaluation_pass():
  model = models.MaskedLanguageModel(ModelConfig(**SMALL))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N), 0, 40)
  variables = model.init(jax.random.PRNGKey(0), tokens)
  rngs = {'dropout': jax.random.PRNGKey(3)}
  train = model.apply(variables, tokens, deterministic=False, rngs=rngs)
  np.testing.assert_array_equal(train, model.apply(variables, tokens))
  dropped = models.MaskedLanguageModel(ModelConfig(**{**SMALL, 'attention_dropout_rate': 0.2}))
  assert not np.allclose(dropped.apply(variables, tokens, deterministic=False, rngs=rngs), train)


def test_causal_linformer_dropout_is_the_same_in_both_modes_and_never_leaks():
  length, block, slots = 16, 4, 2
  q, k, v = qkv(4, length=length)
  weights = jax.random.normal(jax.random.PRNGKey(5), (length, slots)) / np.sqrt(slots)
  dropout = attention.WeightDropout(0.4, jax.random.PRNGKey(6))

  def run(q, k, v, dropout=dropout, **kwargs):
    return causal_linformer.causal_block_attention(
        q, k, v, block=block, slots=slots, projection='linear',
        key_weight=weights, value_weight=weights, dropout=dropout, **kwargs,
    )  # fmt: skip

  at_once = run(q, k, v)
  np.testing.assert_allclose(run(q, k, v, query_blocks_per_step=1), at_once, atol=1e-6)
  assert not np.allclose(at_once, run(q, k, v, dropout=None), atol=1e-3)
  later = np.triu(np.ones((length, length), bool), k=1)
  for jacobian in jax.jacrev(run, argnums=(0, 1, 2))(q, k, v):
    by_position = np.moveaxis(np.asarray(jacobian), (1, 5), (0, 1))
    assert np.all(by_position[later] == 0)


def test_a_kind_without_attention_weights_refuses_attention_dropout():
  with pytest.raises(ConfigError, match=r'attention_dropout_rate=0\.0'):
    ModelConfig(**{**SMALL, 'attention': 'performer', 'attention_dropout_rate': 0.1})
  ModelConfig(**{**SMALL, 'attention': 'performer'})  # 0.0 is fine
  with pytest.raises(ConfigError, match='activation_dropout_rate'):
    ModelConfig(**{**SMALL, 'activation_dropout_rate': 1.0})


def test_fused_kernels_give_way_to_the_einsums_when_weights_drop_out():
  kernel, why = attention.kernel_for_platform(
      'auto', 'gpu', dtype='bfloat16', head_dim=64, attention_dropout=0.1
  )
  assert kernel == 'einsum' and 'attention_dropout_rate' in why
  with pytest.raises(ValueError, match='attention_dropout_rate'):
    attention.kernel_for_platform(
        'cudnn', 'gpu', dtype='bfloat16', head_dim=64, attention_dropout=0.1
    )
  config = ModelConfig(**{**SMALL, 'attention_dropout_rate': 0.1, 'dtype': 'bfloat16'})
  assert config.with_kernel_for('tpu')[0].attention_kernel == 'einsum'
  with pytest.raises(ValueError, match='einsum'):
    q, k, v = qkv(9)
    attention.attend_with('xla', q, k, v, None, attention.WeightDropout(0.1, jax.random.PRNGKey(0)))


def test_a_config_from_before_the_three_rates_keeps_its_dropout():
  old = ml_collections.ConfigDict({'model': {'dropout_rate': 0.2}})
  run_config.complete(old)
  assert old.model.attention_dropout_rate == 0.0
  assert old.model.activation_dropout_rate == 0.2


def test_an_imported_checkpoint_takes_its_dropout_rates():
  config = {
      'vocab_size': 40,
      'num_hidden_layers': 2,
      'num_attention_heads': 2,
      'hidden_size': 16,
      'intermediate_size': 32,
      'type_vocab_size': 1,
      'layer_norm_eps': 1e-5,
      'hidden_dropout_prob': 0.2,
      'attention_probs_dropout_prob': 0.3,
  }

  class Checkpoint:
    architecture, zero_token_types = 'roberta', False

  Checkpoint.config = config
  fields = hf_checkpoint.model_fields(Checkpoint)
  assert (fields['dropout_rate'], fields['attention_dropout_rate']) == (0.2, 0.3)
  del config['attention_probs_dropout_prob']
  assert hf_checkpoint.model_fields(Checkpoint)['attention_dropout_rate'] == 0.1
