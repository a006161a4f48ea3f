"""Continues a prompt with a trained causal language model (config.task='causal_lm').

  python -m linformer_jax.generate --config configs/causal_lm.py --workdir runs/causal_lm \
      --prompt "It was a dark and stormy night" --max_new_tokens 40 \
      [--temperature 0.8 --top_k 40 --seed 0]

Reads the run's newest checkpoint (or the kept step --config.restore_step
names) and tokenizer, feeds `<s>` and the prompt through the decode cache,
samples the continuation (deterministic for a seed; --temperature=0 is
greedy) and prints it, up to the first `</s>`, alone on stdout; stderr names
the step that wrote it. Bad sampling settings and a step that is not kept
end in one error line (the kept steps listed) before anything is sampled.
"""

import dataclasses
import sys

from absl import flags

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax.settings_flags import setting
from linformer_jax.training import text_generation

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  prompt: str = setting('', 'Text to continue (may be empty: start from <s>).')
  max_new_tokens: int = setting(40, 'Tokens to generate.')
  temperature: float = setting(1.0, 'Sampling temperature; 0 is greedy.')
  top_k: int = setting(0, 'Sample among the k most likely tokens (0: all).')
  seed: int = setting(0, 'Sampling seed.')


def define_flags() -> None:
  settings_flags.define_flags(SamplingSettings)
  cli.define_config_flags(reads_run=True)


def main(_):
  settings = settings_flags.from_flags(SamplingSettings)
  continuation = text_generation.continue_prompt(
      FLAGS.config,
      FLAGS.workdir,
      settings.prompt,
      settings.max_new_tokens,
      temperature=settings.temperature,
      top_k=settings.top_k,
      seed=settings.seed,
  )
  print(f'sampled by step {continuation.step} of {FLAGS.workdir}', file=sys.stderr, flush=True)
  print(continuation.text, flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
