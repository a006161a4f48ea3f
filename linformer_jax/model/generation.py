"""Sampling continuations from a causal language model with its decode cache.

`generate` feeds the prompt and then its own samples one token per step through
`CausalLanguageModel(..., decode=True)`, inside one `jax.lax.scan`: each step
costs one token's attention over the cache (the causal Linformer's current
block and block summaries, or the Transformer's keys and values), never a pass
over the whole prefix. Sampling is deterministic for a seed: step t draws with
`fold_in(key, t)`.

Sampling settings are checked before anything is traced (`check_sampling`):
each message starts with the argument's name, which the `generate` command's
flags share.
"""

import math
from typing import Any, Dict, Optional

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


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int, vocab_size: Optional[int] = None
) -> None:
  """Raises ValueError, naming the argument, unless max_new_tokens >= 1,
  temperature is finite and >= 0, and 0 <= top_k <= vocab_size (when given).
  """
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(
        f'max_new_tokens={max_new_tokens!r} is not allowed: generate at least 1 token.'
    )
  # NaN passes every comparison, so finiteness is checked first.
  if isinstance(temperature, bool) or not math.isfinite(temperature) or temperature < 0:
    raise ValueError(
        f'temperature={temperature!r} is not allowed: use a finite number >= 0 (0 is greedy).'
    )
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
    raise ValueError(f'top_k={top_k!r} is not allowed: use 0 (every token) or a positive number.')
  if vocab_size is not None and top_k > vocab_size:
    raise ValueError(
        f'top_k={top_k} is more than the {vocab_size} tokens of the vocabulary: use 0 (every '
        f'token) or at most {vocab_size}.'
    )


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

  Raises:
    ValueError: bad sampling settings (see `check_sampling`), an empty
      prompt, or more positions than the model holds.
  """
  check_sampling(max_new_tokens, temperature, top_k, model.config.vocab_size)
  batch, prompt_len = prompt.shape
  total = prompt_len + max_new_tokens
  max_len = model.config.max_len
  if prompt_len < 1:
    raise ValueError('prompt holds no token: give at least one (e.g. the bos token).')
  if total > max_len:
    raise ValueError(
        f'max_new_tokens={max_new_tokens} after a prompt of {prompt_len} '
        f'token{"s" * (prompt_len != 1)} makes {total} positions; the model holds '
        f'max_len={max_len}: shorten the prompt or generate fewer.'
    )
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
