"""A tiny causal LM trained end to end: next-token metrics checked against a
float64 recomputation, and generation through the cache checked against the
argmax of full forward passes."""

import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linformer_jax.errors import ConfigError
from linformer_jax.model import generation
from linformer_jax.training import run_loading
from linformer_jax.training import text_generation
from linformer_jax.training import trainer
from tests.run_helpers import tiny_config

CAUSAL = {
    'task': 'causal_lm',
    'model.causal': True,
    'model.pre_layer_norm': True,
    'model.block_len': 8,
    'model.projected_len': 2,
}


@pytest.fixture(scope='module')
def causal_run(tmp_path_factory):
  config = tiny_config(**CAUSAL)
  workdir = str(tmp_path_factory.mktemp('causal'))
  return config, workdir, trainer.train_and_evaluate(config, workdir)


def test_a_causal_run_reports_next_token_loss_checked_in_float64(causal_run):
  config, workdir, results = causal_run
  assert results['task'] == 'causal_lm' and results['step'] == 20
  assert results['eval_perplexity'] == pytest.approx(math.exp(results['eval_loss']), rel=1e-6)
  assert results['unigram_perplexity'] > 1
  loaded = run_loading.load_run(config, workdir, with_data=True)
  loss = weight = 0.0
  for batch in loaded.data.eval_batches:
    logits = np.asarray(
        loaded.parts.model.apply(loaded.variables, batch['inputs'], batch['padding_mask']),
        np.float64,
    )
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, batch['targets'][..., None], -1)[..., 0]
    loss -= np.sum(picked * batch['weights'])
    weight += batch['weights'].sum()
    # Each real position predicts the next real token; the last one nothing.
    real = batch['padding_mask']
    np.testing.assert_array_equal(
        batch['weights'] > 0,
        real & np.roll(real, -1, axis=1) & (np.arange(real.shape[1]) < real.shape[1] - 1),
    )
  assert results['eval_loss'] == pytest.approx(loss / weight, rel=1e-4)


def test_greedy_generation_through_the_cache_follows_the_full_forward_argmax(causal_run):
  config, workdir, _ = causal_run
  loaded_run = run_loading.load_run(config, workdir)
  parts, variables, tokenizer = loaded_run.parts, loaded_run.variables, loaded_run.tokenizer
  prompt = jnp.asarray([[tokenizer.bos_id] + tokenizer.encode('the')], jnp.int32)
  generated = np.asarray(
      generation.generate(
          parts.model, variables, prompt, 14, key=jax.random.PRNGKey(0), temperature=0
      )
  )
  tokens = list(np.asarray(prompt)[0])
  # One compiled full pass on a fixed length: positions after the last real
  # token cannot change its logits (the model is causal).
  forward = jax.jit(lambda ids: parts.model.apply(variables, ids))
  for _ in range(14):  # crosses block boundaries (b = 8)
    ids = jnp.asarray([tokens + [0] * (config.model.max_len - len(tokens))], jnp.int32)
    tokens.append(int(jnp.argmax(forward(ids)[0, len(tokens) - 1])))
  np.testing.assert_array_equal(generated[0], tokens)


def test_sampling_is_deterministic_for_a_seed(causal_run):
  config, workdir, _ = causal_run
  sample = lambda seed: text_generation.continue_prompt(
      config, workdir, 'the', 12, temperature=1.0, top_k=20, seed=seed
  )
  first = sample(3)
  assert first == sample(3) and first.step == 20
  assert sample(4).text != first.text


def test_bad_generation_requests_are_one_line_errors(causal_run, tmp_path):
  config, workdir, _ = causal_run
  with pytest.raises(ConfigError, match='max_len=32: shorten the prompt'):
    text_generation.continue_prompt(config, workdir, 'the', 40)
  with pytest.raises(ConfigError, match="config.task='masked_lm' cannot generate"):
    text_generation.continue_prompt(tiny_config(), workdir, 'the', 4)
  with pytest.raises(ConfigError, match='holds no checkpoint'):
    text_generation.continue_prompt(config, str(tmp_path), 'the', 4)
  # A causal kind without a decoding cache is refused before any checkpoint is read.
  reformer = tiny_config(
      **CAUSAL, **{'model.attention': 'reformer', 'model.attention_dropout_rate': 0.0}
  )
  with pytest.raises(ConfigError, match="attention='reformer' cannot decode token by token"):
    text_generation.continue_prompt(reformer, str(tmp_path), 'the', 4)


@pytest.mark.slow
def test_the_generate_command_prints_the_continuation(causal_run):
  config, workdir, _ = causal_run
  flags = [f'--config.{key}={value}' for key, value in CAUSAL.items()]
  command = [sys.executable, '-m', 'linformer_jax.generate', '--config', 'configs/tiny.py', *flags]
  command += [
      '--workdir',
      workdir,
      '--prompt',
      'the',
      '--max_new_tokens',
      '6',
      '--temperature',
      '0',
  ]
  printed = subprocess.run(command, capture_output=True, text=True, check=True)
  expected = text_generation.continue_prompt(config, workdir, 'the', 6, temperature=0)
  assert printed.stdout == expected.text + '\n'
  assert printed.stderr.splitlines()[-1] == f'sampled by step 20 of {workdir}'
