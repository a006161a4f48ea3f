"""An attention kind with a parameter and a setting of its own: a learned
temperature per head.

Head h divides its logits by a learned temperature t_h > 0:

  softmax(Q (E^T K)^T / (sqrt(d) t_h)) (F^T V),

so each head learns how sharp its attention is. t_h = exp(log_temperature[h]),
a parameter of every layer that the kind declares (`parameters`); it starts at
config.model.temperature_init, a setting the kind declares (`settings`): a
field of config.model that is checked, set on the command line and written to
the run's config.json like a built-in one. Registered as
'tempered_linformer'; projections, sharing and the causal and decoding passes
are the Linformer's, and its attention weights (`attention_weights`) are the
Linformer's of the tempered queries, so the spectrum and run.attention read
the P it applies. Train with it:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/tempered \
      --config.extensions="('docs/examples/tempered_attention.py',)" \
      --config.model.attention=tempered_linformer --config.model.temperature_init=2.0
"""

import math

import jax
import jax.numpy as jnp

from linformer_jax.model import attention_kinds
from linformer_jax.model import logical_axes
from linformer_jax.model.attention_kinds.linformer import Linformer
from linformer_jax.registry import Setting


def tempered_queries(q, log_temperature):
  """q [batch, length, heads, head_dim] / t_h: every logit of head h over t_h."""
  temperature = jnp.exp(log_temperature.astype(jnp.float32))
  return (q.astype(jnp.float32) / temperature[:, None]).astype(q.dtype)


@attention_kinds.REGISTRY.register('tempered_linformer')
class TemperedLinformer(Linformer):
  """Linformer with a learned softmax temperature per head."""

  settings = (
      Setting(
          'temperature_init',
          float,
          1.0,
          check=lambda value: 0 < value < math.inf,
          allowed='use a finite number > 0',
          help_text='the softmax temperature each head starts at',
      ),
  )

  def parameters(self, config):
    start = math.log(config.setting('temperature_init'))
    return {
        'log_temperature': attention_kinds.Parameter(
            shape=(config.num_heads,),
            init=jax.nn.initializers.constant(start),
            axes=(logical_axes.HEADS,),
        )
    }

  # Dividing the queries divides every logit, in each pass of the Linformer.
  def attend(self, q, keys, values, key_mask, *, kernel):
    q = tempered_queries(q, self.params['log_temperature'])
    return super().attend(q, keys, values, key_mask, kernel=kernel)

  def causal_attention(self, q, k, v, padding_mask, projection, config):
    q = tempered_queries(q, self.params['log_temperature'])
    return super().causal_attention(q, k, v, padding_mask, projection, config)

  def decode(self, cache, q, k, v, position, projection, config):
    q = tempered_queries(q, self.params['log_temperature'])
    return super().decode(cache, q, k, v, position, projection, config)

  # The P that attend applies, for the spectrum and run.attention.
  def attention_weights(self, q, keys, values, key_mask):
    q = tempered_queries(q, self.params['log_temperature'])
    return super().attention_weights(q, keys, values, key_mask)
