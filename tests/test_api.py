"""The Python API: `linformer_jax.load` and `linformer_jax.build`.

`build` is checked against the model built and applied directly; `load`
against the checkpoint's own parameters, on the session's tiny run (the
`tiny_run` fixture: configs/tiny.py trained once, a Linformer with learned E,
n = 32, k = 8, kept steps 10 and 20). Then what a researcher reads from a
run: hidden states, a layer's attention (rows summing to 1 over the k
compressed keys, or over the n keys of a Transformer), and logits that
padding leaves alone.
"""

import contextlib
import io
import json
import pathlib
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
import linformer_jax
from linformer_jax.checkpoints import partial_restore
from linformer_jax.errors import ConfigError
from linformer_jax.extensions import import_extensions
from linformer_jax.model import attention_capture
from linformer_jax.model import models
from linformer_jax.model import projections
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import run_builder

REPO = pathlib.Path(__file__).resolve().parent.parent
TEXTS = ['def main():', 'import os  # the operating system, and a comment longer than n']


def test_importing_the_package_imports_no_jax():
  # The commands set XLA's flags before JAX is imported; `python -m
  # linformer_jax.X` imports the package first.
  check = "import sys, linformer_jax; assert 'jax' not in sys.modules, sorted(sys.modules)"
  subprocess.run([sys.executable, '-c', check], cwd=REPO, check=True)
  assert 'load' in dir(linformer_jax) and 'build' in dir(linformer_jax)
  with pytest.raises(AttributeError):
    linformer_jax.loads  # pylint: disable=pointless-statement


@pytest.fixture(scope='module')
def fresh():
  """`build` of configs/tiny.py."""
  return linformer_jax.build(tiny.get_config())


def test_build_is_a_fresh_run_of_the_config_and_its_logits_a_direct_apply(fresh):
  config, run = tiny.get_config(), fresh
  assert (run.step, run.workdir, run.tokenizer.vocab_size) == (0, None, 260)
  # The trainer's draw: the model built from config.model, initialised with config.seed.
  model = models.MaskedLanguageModel(ModelConfig.from_config(config.model))
  variables = jax.jit(lambda rng: nn.meta.unbox(model.init(rng, jnp.ones((1, 32), jnp.int32))))(
      jax.random.PRNGKey(config.seed)
  )
  jax.tree_util.tree_map(np.testing.assert_array_equal, run.variables, variables)
  token_ids, padding_mask = run.encode(TEXTS)
  logits = run.logits(token_ids, padding_mask)
  assert logits.shape == (2, 32, 260) and logits.dtype == jnp.float32
  direct = jax.jit(lambda v, t, m: model.apply(v, t, m, deterministic=True))(
      variables, token_ids, padding_mask
  )
  np.testing.assert_array_equal(logits, direct)


def test_build_leaves_the_config_alone_and_has_no_tokenizer_to_train():
  config = tiny.get_config()
  config.data.tokenizer = 'sentencepiece'
  config.extensions = ('docs/examples/tempered_attention.py',)
  run = linformer_jax.build(config)
  assert run.tokenizer is None and run.config.model.temperature_init == 1.0
  assert 'temperature_init' not in config.model  # the declared setting went to a copy
  with pytest.raises(ValueError, match='no tokenizer'):
    run.encode(TEXTS)


def test_encode_cuts_and_pads_texts_to_max_len(fresh):
  run = fresh
  token_ids, padding_mask = run.encode(TEXTS)
  tokenizer = run.tokenizer
  assert token_ids.shape == padding_mask.shape == (2, 32) and token_ids.dtype == np.int32
  short = [tokenizer.bos_id] + tokenizer.encode(TEXTS[0]) + [tokenizer.eos_id]
  np.testing.assert_array_equal(token_ids[0, : len(short)], short)
  assert padding_mask[0].sum() == len(short) and (token_ids[0, len(short) :] == 0).all()
  assert padding_mask[1].all() and token_ids[1, -1] == tokenizer.eos_id
  with pytest.raises(ValueError, match=r'pass \[text\]'):
    run.encode('one text')


@pytest.mark.parametrize(
    'token_ids,padding_mask,message',
    [
        ([1, 2, 3], None, r'add a batch axis'),
        ([[1, 260]], None, r'vocabulary is 0 to 259'),
        ([[1, 2]], [[True]], r"give token_ids' \(1, 2\)"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(fresh, token_ids, padding_mask, message):
  with pytest.raises(ValueError, match=message) as error:
    fresh.logits(token_ids, padding_mask)
  assert '\n' not in str(error.value)


def test_attention_refuses_what_it_would_misreport(fresh):
  run = fresh
  with pytest.raises(ValueError, match='use a layer from 0 to 1'):
    run.attention([[1, 2]], layer=2)
  small = dict(vocab_size=8, max_len=8, num_layers=1, num_heads=1, hidden_dim=4, mlp_dim=4)
  with pytest.raises(ConfigError, match='causal'):
    attention_capture.require_plain_softmax(ModelConfig(**small, causal=True), 'attention()')
  import_extensions(['docs/examples/tempered_attention.py'])
  tempered = ModelConfig(**small, attention='tempered_linformer', projected_len=4)
  with pytest.raises(ConfigError, match="attention='tempered_linformer' weighs its keys"):
    attention_capture.require_plain_softmax(tempered, 'attention()')


@pytest.fixture(scope='module')
def loaded(tiny_run):
  workdir, _ = tiny_run
  return linformer_jax.load(workdir)


def test_load_gives_the_newest_checkpoint_and_its_logits(tiny_run, loaded):
  workdir, results = tiny_run
  assert (loaded.step, loaded.workdir) == (results['step'], workdir) == (20, workdir)
  saved = json.loads((pathlib.Path(workdir) / 'config.json').read_text())
  for field, value in saved['model'].items():
    assert loaded.config.model[field] == (tuple(value) if isinstance(value, list) else value)
  # The checkpoint's parameters, read without the API.
  abstract = run_builder.build_parts(tiny.get_config()).abstract_variables()['params']
  params = partial_restore.restore_params(workdir, abstract, step=20)
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded.params, params)
  token_ids, padding_mask = loaded.encode(TEXTS)
  direct = jax.jit(lambda p, t, m: loaded.model.apply({'params': p}, t, m, deterministic=True))(
      params, token_ids, padding_mask
  )
  np.testing.assert_allclose(loaded.logits(token_ids, padding_mask), direct, rtol=1e-6, atol=1e-6)


def test_step_picks_a_kept_step_and_another_is_refused_in_one_line(tiny_run, loaded):
  workdir, _ = tiny_run
  earlier = linformer_jax.load(workdir, step=10)
  assert earlier.step == 10
  assert not np.array_equal(
      earlier.params['mlm_bias'], loaded.params['mlm_bias']
  ), 'ten steps of training changed nothing'
  with pytest.raises(ConfigError) as error:
    linformer_jax.load(workdir, step=7)
  assert '\n' not in str(error.value) and 'its kept steps are 10, 20' in str(error.value)


def test_load_reads_the_runs_own_config_and_imports_its_extensions(tiny_run, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(tiny_run[0], workdir)
  extension = tmp_path / 'api_test_projection.py'
  extension.write_text(
      'from linformer_jax.model import projections\n\n\n'
      "@projections.REGISTRY.register('api_test_projection')\n"
      'class Unused(projections.SequenceProjectionKind):\n'
      '  pass\n'
  )
  config = json.loads((workdir / 'config.json').read_text())
  # A run resumed from step 10 saved restore_step=10; loading reads the newest.
  config.update(extensions=[str(extension)], restore_step=10)
  (workdir / 'config.json').write_text(json.dumps(config))
  assert 'api_test_projection' not in projections.REGISTRY
  # A kind imported here declares a setting the run never saw: it had the default.
  import_extensions(['docs/examples/tempered_attention.py'])
  run = linformer_jax.load(str(workdir))
  assert 'api_test_projection' in projections.REGISTRY
  assert run.step == 20 and run.config.extensions == (str(extension),)
  assert run.config.model.temperature_init == 1.0
  with pytest.raises(ConfigError, match='config.json does not exist'):
    linformer_jax.load(str(tmp_path))


@pytest.mark.parametrize(
    'saved', [{'hidden_size': 32, 'layers': [1, 2]}, [1, 2], {'model': 3, 'data': {}}]
)
def test_a_folder_whose_config_json_is_not_a_runs_is_refused_in_one_line(tmp_path, saved):
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  with pytest.raises(ConfigError, match="config.json is not a run's config") as error:
    linformer_jax.load(str(tmp_path))
  assert '\n' not in str(error.value)


def test_hidden_states_and_the_linformer_attention_of_a_layer(loaded):
  token_ids, padding_mask = loaded.encode(TEXTS)
  hidden = loaded.hidden_states(token_ids, padding_mask)
  per_layer = loaded.hidden_states(token_ids, padding_mask, per_layer=True)
  assert hidden.shape == (2, 32, 32) and len(per_layer) == 2
  np.testing.assert_array_equal(per_layer[-1], hidden)  # post-LN: no final norm
  attention = loaded.attention(token_ids, layer=1, padding_mask=padding_mask)
  assert attention.probabilities.shape == (2, 2, 32, 8)  # [batch, heads, n, k]
  assert attention.keys.shape == (2, 8, 2, 16) and attention.queries.shape == (2, 32, 2, 16)
  sums = attention.probabilities.sum(-1)
  np.testing.assert_allclose(sums[padding_mask.nonzero()[0], :, padding_mask.nonzero()[1]], 1.0)
  np.testing.assert_array_equal(sums[0, :, ~padding_mask[0]], 0.0)  # padded queries


def test_a_transformers_attention_is_over_the_n_real_keys():
  config = tiny.get_config()
  config.model.attention = 'full'
  run = linformer_jax.build(config)
  token_ids, padding_mask = run.encode(TEXTS)
  probabilities = run.attention(token_ids, 0, padding_mask).probabilities
  assert probabilities.shape == (2, 2, 32, 32)
  real = padding_mask[0].sum()
  np.testing.assert_allclose(probabilities[0, :, :real].sum(-1), 1.0)
  np.testing.assert_array_equal(probabilities[0, :, :, real:], 0.0)  # padded keys


def test_a_real_tokens_logits_do_not_depend_on_padding(loaded):
  token_ids, padding_mask = loaded.encode(TEXTS)
  real = padding_mask[0].sum()
  alone = loaded.logits(token_ids[:1, :real])
  batched = loaded.logits(token_ids, padding_mask)
  np.testing.assert_allclose(batched[0, :real], alone[0], rtol=1e-5, atol=1e-5)


def test_the_python_block_of_the_extending_docs_runs_on_a_trained_run(tiny_run, monkeypatch):
  monkeypatch.chdir(REPO)
  text = (REPO / 'docs' / 'extending.md').read_text()
  (block,) = [
      b for b in re.findall(r'```python\n(.*?)```', text, flags=re.S) if "load('/tmp/tiny')" in b
  ]
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(  # pylint: disable=exec-used
        compile(block.replace("'/tmp/tiny'", repr(tiny_run[0])), 'docs/extending.md', 'exec'), {}
    )
  expected = block.strip().splitlines()[-1].lstrip('# ')
  assert printed.getvalue().strip() == expected


def test_the_tiny_runs_figures_are_those_its_doc_page_reports(tiny_run):
  """docs/training.md gives what configs/tiny.py ends with; a change that moves
  the figures fails here until the page says what the command now prints."""
  text = (REPO / 'docs' / 'training.md').read_text()
  found = re.search(
      r'`validation perplexity ([\d.]+) after (\d+) steps \(a unigram model: ([\d.]+)\)`', text
  )
  assert found, 'docs/training.md no longer quotes the tiny run'
  perplexity, steps, unigram = float(found[1]), int(found[2]), float(found[3])
  _, results = tiny_run
  assert results['step'] == steps
  # One decimal on the page; the tests compile at another LLVM level (last bits).
  assert results['eval_perplexity'] == pytest.approx(perplexity, abs=0.15)
  assert results['unigram_perplexity'] == pytest.approx(unigram, abs=0.15)
