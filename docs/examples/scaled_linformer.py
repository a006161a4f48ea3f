"""An attention variant of your own: Linformer with log-length scaled logits.

Softmax attention spreads out as the number of keys grows; scaling the logits
by the log of that number keeps it as sharp at any length (Chiang & Cholak,
2022, "Overcoming a Theoretical Limitation of Self-Attention"). Here the keys
are Linformer's k compressed positions, so the attention is

  softmax(log(k) * Q (E^T K)^T / sqrt(d)) (F^T V).

Registered as 'scaled_linformer'; everything but the scaling (projections,
sharing, parameters) is the Linformer's. Train with it:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/scaled \
      --config.extensions="('docs/examples/scaled_linformer.py',)" \
      --config.model.attention=scaled_linformer
"""

import math

from linformer_jax.model import attention_kinds
from linformer_jax.model.attention_kinds.linformer import Linformer


@attention_kinds.REGISTRY.register('scaled_linformer')
class ScaledLinformer(Linformer):
  """Linformer with logits multiplied by log(number of keys)."""

  # The causal Linformer's block attention keeps the plain 1/sqrt(d) scale:
  # config.model.causal=True with this kind is a config error, not a surprise.
  supports_causal = False

  def attend(self, q, keys, values, key_mask, *, kernel):
    # Scaling the queries scales every logit; any attention kernel then applies.
    scale = math.log(keys.shape[1])
    return super().attend(q * scale, keys, values, key_mask, kernel=kernel)
