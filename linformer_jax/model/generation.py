"""Sampling continuations from a causal language model with its decode cache.

`generate` feeds the prompt and then its own samples one token per step through
`CausalLanguageModel(..., decode=True)`, inside one `jax.lax.scan`: each step
costs one token's attention over the cache (the causal Linformer's current
block and block summaries, or the Transformer's keys and values), never a pass
over the whole prefix. Sampling is deterministic for a seed: step t draws with
`fold_in(key, t)`.
"""

from typing import Any, Dict

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def empty_cache(model: nn.Module, batch: int) -> Dict[str, Any]:
  """The model's 'cache' collection before the first token: all zeros (position
  0, empty blocks), built from shapes alone, without initialising parameters."""
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.ones((batch, 1), jnp.int32), decode=True)
  )
  return jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes['cache'])


def sample_token(logits: Array, key: Array, temperature: float, top_k: int) -> Array:
  """One token per row of logits [batch, vocab]: the argmax at temperature 0,
  else a draw from softmax(logits / temperature) over the top_k largest
  (all when top_k is 0)."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k:
    kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(
    model: nn.Module,
    variables: Dict[str, Any],
    prompt: Array,
    max_new_tokens: int,
    *,
    key: Array,
    temperature: float = 1.0,
    top_k: int = 0,
) -> Array:
  """The prompt [batch, p] followed by max_new_tokens sampled tokens.

  Args:
    model: a `CausalLanguageModel`.
    variables: its variables without 'cache' (params, constants).
    prompt: int32 [batch, p], p >= 1, no padding (e.g. bos + the prompt's ids).
    max_new_tokens: tokens to sample; p + max_new_tokens <= model max_len.
    key: the sampling key.
    temperature: 0 for greedy decoding.
    top_k: sample among the k most likely tokens (0: all).

  Returns:
    int32 [batch, p + max_new_tokens].
  """
  batch, prompt_len = prompt.shape
  total = prompt_len + max_new_tokens
  max_len = model.config.max_len
  if prompt_len < 1 or max_new_tokens < 0 or total > max_len:
    raise ValueError(
        f'A prompt of {prompt_len} tokens and max_new_tokens={max_new_tokens} make {total} '
        f'positions; the model holds max_len={max_len}: shorten the prompt or generate fewer.'
    )
  if temperature < 0 or top_k < 0:
    raise ValueError(f'temperature={temperature} and top_k={top_k} must be >= 0.')
  padded_prompt = jnp.pad(prompt.astype(jnp.int32), ((0, 0), (0, max_new_tokens)))

  def step(carry, t):
    cache, token = carry
    logits, updated = model.apply(
        {**variables, 'cache': cache}, token[:, None], decode=True, mutable=['cache']
    )
    sampled = sample_token(logits[:, 0], jax.random.fold_in(key, t), temperature, top_k)
    next_token = jnp.where(
        t + 1 < prompt_len, padded_prompt[:, jnp.minimum(t + 1, total - 1)], sampled
    )
    return (updated['cache'], next_token), next_token

  start = (empty_cache(model, batch), padded_prompt[:, 0])
  _, produced = jax.lax.scan(step, start, jnp.arange(total - 1))
  return jnp.concatenate([prompt[:, :1].astype(jnp.int32), produced.T], axis=1)
