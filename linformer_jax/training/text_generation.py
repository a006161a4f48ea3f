"""Text from a trained causal language model: a run's checkpoint, its tokenizer
and the cached sampling of `linformer_jax.model.generation`."""

import jax
import jax.numpy as jnp
import ml_collections

from linformer_jax.errors import ConfigError
from linformer_jax.model import generation
from linformer_jax.training import run_builder


def continue_prompt(
    config: ml_collections.ConfigDict,
    workdir: str,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
) -> str:
  """The sampled continuation of `prompt` by workdir's newest checkpoint, cut
  at the first `</s>`.

  The model reads `<s>` and the prompt's tokens, then samples max_new_tokens
  (deterministic for a seed; temperature 0 is greedy).

  Raises:
    ConfigError: not a causal_lm config, a workdir without a matching run or
      tokenizer, or a prompt and max_new_tokens longer than model.max_len.
  """
  if config.get('task') != 'causal_lm':
    raise ConfigError(
        f"config.task={config.get('task')!r} cannot generate; use a causal_lm config "
        '(e.g. configs/causal_lm.py).'
    )
  parts, _, variables, tokenizer = run_builder.load_for_inference(config, workdir)
  prompt_ids = [tokenizer.bos_id] + tokenizer.encode(prompt)
  try:
    tokens = generation.generate(
        parts.model,
        variables,
        jnp.asarray([prompt_ids], jnp.int32),
        max_new_tokens,
        key=jax.random.PRNGKey(seed),
        temperature=temperature,
        top_k=top_k,
    )
  except ValueError as error:
    raise ConfigError(f'{error} (--prompt, --max_new_tokens, --temperature, --top_k)') from None
  new = [int(t) for t in jax.device_get(tokens)[0, len(prompt_ids) :]]
  if tokenizer.eos_id in new:
    new = new[: new.index(tokenizer.eos_id)]
  return tokenizer.decode(new)
