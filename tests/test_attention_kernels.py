"""model.attention_kernel='auto': the kernel a step takes on the devices it is
compiled for, the one-line refusals of a kernel the devices cannot run, and a
fused kernel split over a mesh, per device, inside a shard_map."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import sharding


@pytest.mark.parametrize(
    'platform, dtype, head_dim, kernel',
    [
        ('cpu', 'bfloat16', 64, 'einsum'),
        ('tpu', 'bfloat16', 64, 'pallas'),
        ('tpu', 'float32', 64, 'pallas'),
        ('gpu', 'bfloat16', 64, 'cudnn'),
        ('cuda', 'float16', 128, 'cudnn'),
        ('gpu', 'float32', 64, 'einsum'),  # cuDNN takes 16-bit inputs
        ('gpu', 'bfloat16', 160, 'einsum'),  # wider than cuDNN's 128
        ('gpu', 'bfloat16', 36, 'einsum'),  # not a multiple of 8
    ],
)
def test_auto_takes_cudnn_exactly_where_it_can_run(platform, dtype, head_dim, kernel):
  chosen, why = attention.kernel_for_platform(
      'auto', platform, dtype=dtype, head_dim=head_dim, lengths=(512, 128)
  )
  assert chosen == kernel
  assert why.startswith('auto: ')
  if platform.startswith('gpu') and kernel == 'einsum':
    assert 'since cuDNN attention takes' in why


def test_auto_on_a_tpu_takes_the_einsums_for_lengths_the_kernel_cannot_tile():
  chosen, why = attention.kernel_for_platform(
      'auto', 'tpu', dtype='bfloat16', head_dim=64, lengths=(512, 64)
  )
  assert chosen == 'einsum'
  assert why == 'auto: einsum on tpu, since the Pallas TPU kernel takes query and key lengths ' + (
      'that are multiples of 128, not 64'
  )
  with pytest.raises(ValueError, match="'pallas': the Pallas TPU kernel .* not 64; or use 'auto'"):
    attention.kernel_for_platform('pallas', 'tpu', dtype='bfloat16', head_dim=64, lengths=(64,))


@pytest.mark.parametrize('kernel', ['einsum', 'xla'])
def test_an_explicit_kernel_is_kept(kernel):
  assert attention.kernel_for_platform(kernel, 'gpu', dtype='float32', head_dim=64) == (
      kernel,
      'as configured',
  )


def test_cudnn_the_devices_cannot_run_is_refused_with_the_fix():
  with pytest.raises(ValueError, match="compiled for cpu; use 'auto' or 'einsum'"):
    attention.kernel_for_platform('cudnn', 'cpu', dtype='bfloat16', head_dim=64)
  with pytest.raises(ValueError, match="16-bit inputs, not float32 .*or use 'auto'"):
    attention.kernel_for_platform('cudnn', 'gpu', dtype='float32', head_dim=64)
  with pytest.raises(ValueError, match="'pallas' runs on TPUs.*compiled for gpu"):
    attention.kernel_for_platform('pallas', 'gpu', dtype='bfloat16', head_dim=64)


def test_a_run_resolves_auto_by_its_mesh_and_names_the_choice():
  config = tiny.get_config()
  assert config.model.attention_kernel == 'auto'
  parts = run_builder.build_parts(config)
  assert parts.model_config.attention_kernel == 'einsum'
  assert parts.kernel_reason == 'auto: einsum on cpu'
  config.model.attention_kernel = 'cudnn'
  with pytest.raises(ConfigError, match="'cudnn' runs on NVIDIA GPUs"):
    run_builder.build_parts(config)


def test_auto_outside_a_run_matches_einsum_on_this_host():
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(key, (2, 8, 2, 16)) for key in keys)
  mask = jnp.arange(8)[None, :] < jnp.array([[8], [5]])
  auto = attention.attend_with('auto', q, k, v, mask)
  np.testing.assert_array_equal(np.asarray(auto), np.asarray(attention.attend(q, k, v, mask)))


def _reference(q, k, v, key_mask):
  """Softmax attention in float64 NumPy, masked keys left out."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  if key_mask is not None:
    logits = np.where(np.asarray(key_mask)[:, None, None, :], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', weights, v)


@pytest.mark.parametrize(
    'q_length, kv_length, padded',
    [(256, 128, False), (128, 128, True), (384, 384, True)],
    ids=['linformer', 'transformer-padded', 'three-blocks'],
)
def test_the_pallas_tpu_kernel_matches_float64_in_interpret_mode(q_length, kv_length, padded):
  """JAX's TPU flash attention kernel, interpreted on this CPU: outputs and
  gradients against the float64 reference and the einsums."""
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q = jax.random.normal(keys[0], (2, q_length, 2, 16))
  k, v = (jax.random.normal(key, (2, kv_length, 2, 16)) for key in keys[1:3])
  mask = jnp.arange(kv_length)[None, :] < jnp.array([[kv_length], [kv_length - 5]])
  mask = mask if padded else None
  with pltpu.force_tpu_interpret_mode():
    out = attention.attend_with('pallas', q, k, v, mask)
    grads = jax.grad(
        lambda *x: jnp.sum(jnp.sin(attention.attend_with('pallas', *x, mask))), (0, 1, 2)
    )(q, k, v)
  np.testing.assert_allclose(np.asarray(out), _reference(q, k, v, mask), rtol=2e-5, atol=2e-5)
  expected = jax.grad(lambda *x: jnp.sum(jnp.sin(attention.attend(*x, mask))), (0, 1, 2))(q, k, v)
  for got, want in zip(grads, expected):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.long
def test_a_model_on_the_pallas_kernel_keeps_padding_out():
  """A tiny Linformer and Transformer in interpret mode: the einsums' logits,
  and a padded example's real positions as alone."""
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 256), 1, 40)
  mask = jnp.arange(256)[None, :] < jnp.array([[256], [128]])
  small = dict(num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, max_len=256, vocab_size=50)
  for attention_name in ('full', 'linformer'):
    einsum = ModelConfig(
        **small, attention=attention_name, projected_len=128, attention_kernel='einsum'
    )
    pallas = ModelConfig(
        **small, attention=attention_name, projected_len=128, attention_kernel='pallas'
    )
    model = models.MaskedLanguageModel(einsum)
    variables = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens))
    reference = model.apply(variables, tokens, mask, deterministic=True)
    with pltpu.force_tpu_interpret_mode():
      logits = models.MaskedLanguageModel(pallas).apply(variables, tokens, mask, deterministic=True)
      alone = models.MaskedLanguageModel(pallas).apply(
          variables, tokens[1:, :128], mask[1:, :128], deterministic=True
      )
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(logits[1, :128]), np.asarray(alone[0]), rtol=1e-5, atol=1e-5
    )


def _partition(data: int, model: int) -> attention.MeshPartition:
  mesh = jax.sharding.AbstractMesh((data, model), sharding.MESH_AXES)
  return sharding.kernel_partition(mesh, sharding.DEFAULT_AXIS_RULES)


def test_the_partition_follows_the_axis_rules():
  assert _partition(2, 4)[1:] == (('data',), ('model',))
  mesh = jax.sharding.AbstractMesh((2, 4), sharding.MESH_AXES)
  heads_replicated = sharding.kernel_partition(mesh, (('batch', 'data'), ('heads', None)))
  assert heads_replicated[1:] == (('data',), ())
  assert _partition(2, 4).refusal(batch=6, heads=8) is None
  assert _partition(2, 4).refusal(batch=3, heads=8) == (
      'a batch of 3 does not divide over the 2-way mesh axis data'
  )
  assert _partition(2, 4).refusal(batch=2, heads=6) == (
      'a head count of 6 does not divide over the 4-way mesh axis model'
  )


@pytest.mark.parametrize(
    'platform, dtype, kept',
    [('tpu', 'bfloat16', True), ('gpu', 'bfloat16', True), ('gpu', 'float32', False)],
)
def test_a_fused_kernel_keeps_the_mesh_it_runs_over(platform, dtype, kept):
  """cuDNN and Pallas run per device inside a shard_map; the einsums need none."""
  config = ModelConfig(
      vocab_size=50,
      max_len=256,
      projected_len=128,
      dtype=dtype,
      num_heads=4,
      hidden_dim=256,
      attention_dropout_rate=0.0,  # only the einsums drop out attention weights
  )
  resolved, _ = config.with_kernel_for(platform, _partition(2, 2))
  assert (resolved.kernel_partition is not None) == kept
  if kept:
    assert resolved.kernel == attention.PartitionedKernel(
        resolved.attention_kernel, _partition(2, 2)
    )
  else:
    assert resolved.kernel == 'einsum'
  one_device, _ = config.with_kernel_for(platform, _partition(1, 1))
  assert one_device.kernel_partition is None and isinstance(one_device.kernel, str)


def test_auto_in_a_causal_model_is_the_einsums_it_attends_by():
  config = ModelConfig(vocab_size=50, max_len=256, projected_len=8, block_len=64, causal=True)
  resolved, why = config.with_kernel_for('tpu', _partition(2, 2))
  assert (resolved.attention_kernel, resolved.kernel_partition) == ('einsum', None)
  assert why == 'auto: einsum on tpu, since a causal model attends by its own einsums'


def test_the_kernel_partition_is_no_config_field():
  with pytest.raises(ConfigError, match=r'Unknown field\(s\) config.model.kernel_partition'):
    ModelConfig.from_config({'vocab_size': 50, 'max_len': 256, 'kernel_partition': None})


@pytest.mark.slow
def test_the_pallas_kernel_on_a_mesh_runs_per_device_and_matches_the_einsums(tmp_path):
  """On 4 CPU devices, (2, 2): batch over 'data' and heads over 'model' inside a
  shard_map, outputs and gradients as the einsums on one device; a batch and
  heads that do not divide over the mesh attend by the einsums."""
  out = tmp_path / 'partition.json'
  worker = pathlib.Path(__file__).with_name('kernel_partition_worker.py')
  env = {key: value for key, value in os.environ.items() if key != 'XLA_FLAGS'}
  result = subprocess.run(
      [sys.executable, str(worker), str(out)], env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  found = json.loads(out.read_text())
  assert found['partition'] == [['data'], ['model']]
  assert found['manual_computation'] and found['per_device_query']
  assert found['output_spec'] == "P('data', None, 'model')"
  assert found['output'] < 2e-6 and found['unmasked'] < 2e-6
  assert found['gradients'] < 2e-5
  assert found['odd_shapes'] < 1e-6 and not found['odd_shapes_manual']


def test_the_run_says_when_its_micro_batches_are_too_small_for_the_kernel():
  """8 sequences in 8 micro-batches on an (8, 1) mesh: one row a micro-batch
  cannot split 8 ways, so the train step attends by the einsums, and says so."""
  config = tiny.get_config()
  config.batch_size, config.grad_accum_steps = 8, 8
  model_config = dataclasses.replace(
      ModelConfig(vocab_size=50, max_len=256, projected_len=128, num_heads=8, hidden_dim=512),
      attention_kernel='pallas',
      kernel_partition=_partition(8, 1),
  )
  assert run_builder.train_step_kernel_note(
      model_config, run_config.RunConfig.from_config(config).loop
  ) == (
      '; the train step attends by einsum, since a batch of 1 does not divide over the '
      '8-way mesh axis data'
  )
  config.grad_accum_steps = 1
  assert (
      run_builder.train_step_kernel_note(
          model_config, run_config.RunConfig.from_config(config).loop
      )
      == ''
  )


@pytest.mark.parametrize('attention_name', ['performer', 'linear_transformer'])
def test_auto_in_a_kind_without_a_softmax_kernel_is_the_einsums(attention_name):
  config = ModelConfig(
      vocab_size=50,
      max_len=256,
      attention=attention_name,
      dtype='bfloat16',
      attention_dropout_rate=0.0,  # the kind forms no attention weights
  )
  resolved, why = config.with_kernel_for('gpu', _partition(2, 2))
  assert (resolved.attention_kernel, resolved.kernel_partition) == ('einsum', None)
  assert (
      why == f'auto: einsum on gpu, since attention={attention_name!r} attends by its own einsums'
  )
