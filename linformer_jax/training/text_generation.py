"""Text from a trained causal language model: a run's checkpoint, its tokenizer
and the cached sampling of `linformer_jax.model.generation`.

The checkpoint is the run's newest, or the kept step `config.restore_step`
names (0 = the newest); generating only reads the workdir.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_kinds
from linformer_jax.model import generation
from linformer_jax.training import run_loading

# jax.random.PRNGKey takes a 64-bit signed seed.
SEEDS = range(-(2**63), 2**63)


class Continuation(NamedTuple):
  """What `continue_prompt` sampled, and the step of the checkpoint that did."""

  text: str
  step: int


def continue_prompt(
    config: ml_collections.ConfigDict,
    workdir: str,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
) -> Continuation:
  """The sampled continuation of `prompt` by workdir's newest checkpoint (or
  its kept config.restore_step), cut at the first `</s>`.

  The model reads `<s>` and the prompt's tokens, then samples max_new_tokens
  (deterministic for a seed; temperature 0 is greedy). The sampling settings
  are checked before the checkpoint is read; messages name them as the
  `generate` command's flags.

  Raises:
    ConfigError: not a causal_lm config, an attention kind that cannot decode
      token by token, bad sampling settings or seed, a
      workdir without a matching run, tokenizer or kept restore_step, or a
      prompt and max_new_tokens longer than model.max_len.
  """
  if config.task != 'causal_lm':
    raise ConfigError(
        f'config.task={config.task!r} cannot generate; use a causal_lm config '
        '(e.g. configs/causal_lm.py).'
    )
  kind = attention_kinds.kind(config.model.attention)
  if not kind.decodes:
    decoding = [
        name for name in attention_kinds.REGISTRY.names() if attention_kinds.kind(name).decodes
    ]
    raise ConfigError(
        f'attention={kind.name!r} cannot decode token by token, so generate cannot sample '
        f"from this run; generate from a causal run of {', '.join(decoding)}."
    )
  if seed not in SEEDS:
    raise ConfigError(f'--seed={seed} is not allowed: use an integer from -2**63 to 2**63 - 1.')
  try:
    generation.check_sampling(max_new_tokens, temperature, top_k)
  except ValueError as error:
    raise ConfigError(f'--{error}') from None
  loaded = run_loading.load_run(config, workdir)
  parts, step, variables, tokenizer = loaded.parts, loaded.step, loaded.variables, loaded.tokenizer
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
    raise ConfigError(f'--{error}') from None
  new = [int(t) for t in jax.device_get(tokens)[0, len(prompt_ids) :]]
  if tokenizer.eos_id in new:
    new = new[: new.index(tokenizer.eos_id)]
  return Continuation(tokenizer.decode(new), step)
