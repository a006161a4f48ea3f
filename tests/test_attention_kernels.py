"""model.attention_kernel='auto': the kernel a step takes on the devices it is
compiled for, and the one-line refusals of a kernel the devices cannot run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention
from linformer_jax.training import run_builder


@pytest.mark.parametrize(
    'platform, dtype, head_dim, kernel',
    [
        ('cpu', 'bfloat16', 64, 'einsum'),
        ('tpu', 'bfloat16', 64, 'einsum'),
        ('gpu', 'bfloat16', 64, 'cudnn'),
        ('cuda', 'float16', 128, 'cudnn'),
        ('gpu', 'float32', 64, 'einsum'),  # cuDNN takes 16-bit inputs
        ('gpu', 'bfloat16', 160, 'einsum'),  # wider than cuDNN's 128
        ('gpu', 'bfloat16', 36, 'einsum'),  # not a multiple of 8
    ],
)
def test_auto_takes_cudnn_exactly_where_it_can_run(platform, dtype, head_dim, kernel):
  chosen, why = attention.kernel_for_platform('auto', platform, dtype=dtype, head_dim=head_dim)
  assert chosen == kernel
  assert why.startswith('auto: ')
  if platform.startswith('gpu') and kernel == 'einsum':
    assert 'since cuDNN attention takes' in why


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
