"""The Python API: `linformer_jax.train`, `load` and `build`, and a `Run`.

`build` is checked against the model built and applied directly; `load`
against the checkpoint's own parameters, on the session's tiny run (the
`tiny_run` fixture: configs/tiny.py trained once, a Linformer with learned E,
n = 32, k = 8, kept steps 10 and 20); `train` and `evaluate` against the
run's own eval_results.json. Then what a researcher reads from a run: texts
encoded as the data pipeline encodes them, hidden states from the
embeddings' output on, a layer's attention (rows summing to 1 over the k
compressed keys, or over the n keys of a Transformer), logits that padding
leaves alone, gradients through `params=`, and the masked-LM head's guesses.
docs/api.md's blocks run in tests/test_api_docs.py.
"""

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
# Rows of 13 and 11 tokens, neither cut.
SHORT_TEXTS = ['def main():', 'import os']


def test_importing_the_package_imports_no_jax():
  # The commands set XLA's flags before JAX is imported; `python -m
  # linformer_jax.X` imports the package first.
  check = "import sys, linformer_jax; assert 'jax' not in sys.modules, sorted(sys.modules)"
  subprocess.run([sys.executable, '-c', check], cwd=REPO, check=True)
  # The API and nothing else: no helper of the package's own module shows.
  assert dir(linformer_jax) == sorted(linformer_jax.__all__)
  assert {'build', 'load', 'train', 'Run'} <= set(linformer_jax.__all__)
  assert {'Any', 'importlib', 'api'}.isdisjoint(linformer_jax.__all__)
  assert all(getattr(linformer_jax, name) is not None for name in linformer_jax.__all__)
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
  token_ids, padding_mask = run.encode(SHORT_TEXTS)
  logits = run.logits(token_ids, padding_mask)
  assert logits.shape == (2, 13, 260) and logits.dtype == jnp.float32
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


def test_encode_pads_to_the_longest_row_as_the_data_pipeline_encodes(fresh):
  run, tokenizer = fresh, fresh.tokenizer
  token_ids, padding_mask = run.encode(SHORT_TEXTS)
  short = [tokenizer.bos_id] + tokenizer.encode(TEXTS[0]) + [tokenizer.eos_id]
  assert token_ids.shape == padding_mask.shape == (2, len(short)) and token_ids.dtype == np.int32
  np.testing.assert_array_equal(token_ids[0], short)
  assert padding_mask[0].all() and padding_mask[1].sum() == 11 and (token_ids[1, 11:] == 0).all()
  fixed, fixed_mask = run.encode(TEXTS[:1], padding='max_length')
  assert fixed.shape == (1, 32) and fixed_mask.sum() == len(short)
  with pytest.warns(UserWarning, match='dropping 5 tokens'):
    eight, _ = run.encode(TEXTS[:1], padding='max_length', max_length=8)
  assert eight.tolist() == [short[:7] + [tokenizer.eos_id]]
  # A pair: [bos] first SEP second [eos], the separator RoBERTa's [eos] [eos].
  (pair,), _ = run.encode(['yes'], ['no'])
  assert pair.tolist() == [1] + tokenizer.encode('yes') + [2, 2] + tokenizer.encode('no') + [2]
  with pytest.raises(ValueError, match=r'pass \[text\]'):
    run.encode('one text')


def test_encode_says_how_many_tokens_it_cut_or_refuses_to_cut(fresh):
  run = fresh
  with pytest.warns(UserWarning, match=r'cut 1 of 2 rows to max_length=32, dropping 32 tokens'):
    token_ids, _ = run.encode(TEXTS)  # TEXTS[1] is 62 bytes: 64 tokens with bos and eos
  assert token_ids.shape == (2, 32) and token_ids[1, -1] == run.tokenizer.eos_id
  with pytest.warns(UserWarning, match=r'dropping 3 tokens \(rows \[0\]\)'):
    run.encode(['yes'], ['no!'], max_length=7)  # 10 tokens: the longer text loses first
  with pytest.raises(ValueError, match='Row 1 is 64 tokens.*32 more than max_length=32') as error:
    run.encode(TEXTS, truncation=False)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize(
    'settings,message',
    [
        (dict(padding='do_not_pad'), "padding='do_not_pad': use one of 'longest', 'max_length'"),
        (dict(padding=True), "padding=True: use one of 'longest', 'max_length'"),
        (dict(max_length=33), r'max_length=33: use 2 to 32 \(config.model.max_len'),
        (dict(max_length=1), 'max_length=1: use 2 to 32'),
        (dict(truncation='longest_first'), 'use True'),
        (dict(text_pairs=['a', 'b']), 'text_pairs holds 2 texts and texts 1'),
        (dict(return_segment_ids=True), r'no segment embedding \(model.num_segments=0\)'),
    ],
)
def test_bad_encode_settings_are_refused_in_one_line(fresh, settings, message):
  with pytest.raises(ValueError, match=message) as error:
    fresh.encode(['a'], **settings)
  assert '\n' not in str(error.value)


@pytest.fixture(scope='module')
def segmented():
  """`build` of configs/tiny.py with two segments, its segment embedding drawn
  at random (it starts at zero), and a direct apply of its model."""
  config = tiny.get_config()
  config.model.num_segments = 2
  run = linformer_jax.build(config)
  params = dict(run.params, encoder=dict(run.params['encoder']))
  params['encoder']['segment_embedding'] = jax.random.normal(jax.random.PRNGKey(1), (2, 32))
  apply = jax.jit(lambda p, t, m, s: run.model.apply({'params': p}, t, m, segments=s))
  return run, params, apply


def test_segment_ids_reach_the_model_where_it_has_segments(segmented, fresh):
  run, params, apply = segmented
  token_ids, padding_mask, segment_ids = run.encode(['yes'], ['no'], return_segment_ids=True)
  assert segment_ids.tolist() == [[0] * 5 + [1] * 4]  # bos yes [eos] | [eos] no [eos]
  logits = run.logits(token_ids, padding_mask, segment_ids, params=params)
  direct = apply(params, token_ids, padding_mask, segment_ids)
  np.testing.assert_allclose(logits, direct, rtol=1e-6, atol=1e-6)
  unsegmented = run.logits(token_ids, padding_mask, params=params)  # all segment 0
  assert not np.allclose(logits, unsegmented)
  output = run(token_ids, padding_mask, segment_ids, params=params, output_hidden_states=True)
  hidden = run.hidden_states(token_ids, padding_mask, segment_ids, params=params)
  np.testing.assert_array_equal(output.hidden_states[-1], hidden)
  assert not np.allclose(hidden, run.hidden_states(token_ids, padding_mask, params=params))
  with pytest.raises(ValueError, match='pass return_segment_ids=True'):
    run.encode(['yes'], ['no'])  # a pair without its segments would read as one text
  with pytest.raises(ValueError, match='segments 0 to 1'):
    run.logits(token_ids, padding_mask, segment_ids + 1)
  with pytest.raises(ValueError, match=r'no segment embedding \(model.num_segments=0\)'):
    fresh.logits(token_ids, padding_mask, segment_ids)


@pytest.mark.parametrize(
    'token_ids,padding_mask,message',
    [
        ([1, 2, 3], None, r'add a batch axis'),
        ([[1, 260]], None, r'vocabulary is 0 to 259'),
        ([[1, 2]], [[True]], r"give token_ids' \(1, 2\)"),
        ((np.ones((1, 2), int), np.ones((1, 2), bool)), None, r'run.logits\(\*run.encode'),
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
    attention_capture.require_attention_weights(ModelConfig(**small, causal=True), 'attention()')
  # A kind that overrides attend without attention_weights would get a P it never used.
  import_extensions(['docs/examples/scaled_linformer.py', 'docs/examples/tempered_attention.py'])
  scaled = ModelConfig(**small, attention='scaled_linformer', projected_len=4)
  with pytest.raises(ConfigError, match="attention='scaled_linformer' weighs its keys"):
    attention_capture.require_attention_weights(scaled, 'attention()')
  tempered = ModelConfig(**small, attention='tempered_linformer', projected_len=4)
  attention_capture.require_attention_weights(tempered, 'attention()')  # it says how


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
  token_ids, padding_mask = loaded.encode(SHORT_TEXTS)
  direct = jax.jit(lambda p, t, m: loaded.model.apply({'params': p}, t, m, deterministic=True))(
      params, token_ids, padding_mask
  )
  np.testing.assert_allclose(loaded.logits(token_ids, padding_mask), direct, rtol=1e-6, atol=1e-6)


def test_a_run_and_its_outputs_print_in_one_short_line(tiny_run, loaded):
  workdir, results = tiny_run
  text = repr(loaded)
  assert len(text) < 250 and '\n' not in text
  for part in (f'workdir={workdir!r}', 'step=20', "attention='linformer'", 'n=32', 'k=8'):
    assert part in text
  assert f'parameters={results["parameters"]:,}' in text
  output = loaded(TEXTS[:1], output_hidden_states=True, output_attentions=True)
  assert repr(output) == (
      'ModelOutput(logits=float32[1, 13, 260], hidden_states=3 x float32[1, 13, 32], '
      'attentions=2 x float64[1, 2, 13, 8])'
  )
  assert len(repr(loaded.attention(TEXTS[:1], 0))) < 200


def test_evaluate_after_load_with_data_gives_trainings_figures_under_its_names(tiny_run, loaded):
  workdir, results = tiny_run
  with pytest.raises(ValueError, match='with_data=True') as error:
    loaded.evaluate()
  # The message's call is the one that works.
  (call,) = re.findall(r'linformer_jax\.load\(.*\)', str(error.value))
  evaluated = eval(call, {'linformer_jax': linformer_jax}).evaluate()  # pylint: disable=eval-used
  training = {key: value for key, value in results.items() if key.startswith('eval_')}
  assert {'step', 'task', 'unigram_perplexity', *training} == set(evaluated)
  assert (evaluated['step'], evaluated['eval_split'], evaluated['task']) == (
      20,
      'validation',
      'masked_lm',
  )
  for key in ('eval_loss', 'eval_perplexity', 'eval_accuracy', 'unigram_perplexity'):
    assert evaluated[key] == pytest.approx(results[key], rel=1e-5), key
  with pytest.raises(ConfigError, match=r"split='test' names the data .* with_data=True"):
    linformer_jax.load(workdir, split='test')


def test_train_resumes_a_finished_run_and_returns_it_loaded_with_its_results(tiny_run):
  workdir, results = tiny_run
  config = tiny.get_config()
  trained = linformer_jax.train(config, workdir)  # at total_steps: only evaluated again
  assert isinstance(trained, linformer_jax.TrainOutput) and trained.run.step == 20
  saved = json.loads((pathlib.Path(workdir) / 'eval_results.json').read_text())
  assert trained.results == saved
  assert trained.results['eval_loss'] == pytest.approx(results['eval_loss'], rel=1e-6)
  assert 'temperature_init' not in config.model and config.to_dict() == tiny.get_config().to_dict()


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


def test_per_layer_hidden_states_start_at_the_embeddings_output(loaded):
  token_ids, padding_mask = loaded.encode(SHORT_TEXTS)
  hidden = loaded.hidden_states(token_ids, padding_mask)
  per_layer = loaded.hidden_states(token_ids, padding_mask, per_layer=True)
  assert hidden.shape == (2, 13, 32) and len(per_layer) == 3  # num_layers + 1
  np.testing.assert_array_equal(per_layer[-1], hidden)
  # The embeddings' output, by hand: post-LN, LayerNorm(token + position embedding).
  encoder = jax.tree_util.tree_map(np.float64, loaded.params['encoder'])
  x = encoder['token_embedding']['embedding'][token_ids] + encoder['position_embedding'][:13]
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  x = x * encoder['embedding_norm']['scale'] + encoder['embedding_norm']['bias']
  np.testing.assert_allclose(per_layer[0], x, rtol=1e-4, atol=1e-4)
  assert not np.allclose(per_layer[1], per_layer[0]) and not np.allclose(per_layer[1], hidden)


def test_calling_the_run_gives_every_output_of_one_pass(loaded):
  token_ids, padding_mask = loaded.encode(SHORT_TEXTS)
  output = loaded(token_ids, padding_mask, output_hidden_states=True, output_attentions=True)
  np.testing.assert_array_equal(output.logits, loaded.logits(token_ids, padding_mask))
  per_layer = loaded.hidden_states(token_ids, padding_mask, per_layer=True)
  jax.tree_util.tree_map(np.testing.assert_array_equal, output.hidden_states, per_layer)
  for layer, probabilities in enumerate(output.attentions):
    attention = loaded.attention(token_ids, layer, padding_mask)
    np.testing.assert_array_equal(probabilities, attention.probabilities)
  plain = loaded(token_ids, padding_mask)
  assert plain.hidden_states is None and plain.attentions is None
  # Texts are encoded with encode's defaults.
  np.testing.assert_array_equal(loaded(SHORT_TEXTS).logits, output.logits)


def test_the_hidden_states_of_a_pre_ln_model_end_with_its_final_norm():
  config = tiny.get_config()
  config.model.pre_layer_norm = True
  run = linformer_jax.build(config)
  per_layer = run.hidden_states(TEXTS[:1], per_layer=True)
  np.testing.assert_array_equal(per_layer[-1], run.hidden_states(TEXTS[:1]))
  # Normed (scale 1, bias 0 at init): no layer's output is.
  np.testing.assert_allclose(per_layer[-1].mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(per_layer[-1].std(-1), 1.0, rtol=1e-2)
  assert np.abs(per_layer[-2].mean(-1)).max() > 1e-3


def test_a_gradient_with_respect_to_the_parameters_is_the_direct_one(fresh):
  run = fresh
  token_ids, padding_mask = run.encode(SHORT_TEXTS)
  grads = jax.grad(lambda p: run.logits(token_ids, padding_mask, params=p).sum())(run.params)

  def direct(params):
    return run.model.apply({'params': params}, token_ids, padding_mask, deterministic=True).sum()

  expected = jax.jit(jax.grad(direct))(run.params)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, expected
  )
  assert np.abs(grads['encoder']['layers_0']['attention']['query']['kernel']).max() > 0
  with pytest.raises(ValueError, match='params must be shaped as run.params'):
    run.logits(token_ids, padding_mask, params={'encoder': run.params['encoder']})
  with pytest.raises(ValueError, match='takes no traced params'):
    jax.grad(lambda p: run.attention(token_ids, 0, params=p).probabilities.sum())(run.params)


def test_fill_mask_gives_the_heads_likeliest_tokens_as_hugging_face_does(loaded):
  guesses = loaded.fill_mask('import o<mask>', top_k=4)
  tokenizer = loaded.tokenizer
  ids = [tokenizer.bos_id] + tokenizer.encode('import o') + [tokenizer.mask_id, tokenizer.eos_id]
  logits = np.asarray(loaded.logits([ids]), np.float64)[0, len(ids) - 2]
  probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
  assert [g['token'] for g in guesses] == list(np.argsort(-probabilities)[:4])
  for guess in guesses:
    assert set(guess) == {'score', 'token', 'token_str', 'sequence'}
    assert guess['score'] == pytest.approx(probabilities[guess['token']], rel=1e-5)
    assert guess['sequence'] == 'import o' + guess['token_str']
  assert [g['token'] for g in loaded.fill_mask(['import o<mask>'], top_k=4)[0]] == [
      g['token'] for g in guesses
  ]
  for text, message in (('no mask', 'holds 0 <mask>'), ('<mask><mask>', 'holds 2 <mask>')):
    with pytest.raises(ValueError, match=message):
      loaded.fill_mask(text)
  with pytest.raises(ValueError, match='top_k=0: use an integer from 1 to 260'):
    loaded.fill_mask('a<mask>', top_k=0)


def test_fill_mask_refuses_a_run_that_is_no_masked_lm_in_one_line():
  config = tiny.get_config()
  config.task = 'causal_lm'
  config.model.causal = True
  config.model.attention = 'full'
  with pytest.raises(
      ConfigError, match="needs a masked-LM run; this one is config.task='causal_lm'"
  ):
    linformer_jax.build(config).fill_mask('a<mask>')


@pytest.mark.filterwarnings('ignore:encode cut')  # TEXTS[1] fills n
def test_the_linformer_attention_of_a_layer(loaded):
  token_ids, padding_mask = loaded.encode(TEXTS, padding='max_length', truncation=True)
  attention = loaded.attention(token_ids, layer=1, padding_mask=padding_mask)
  assert attention.probabilities.shape == (2, 2, 32, 8)  # [batch, heads, n, k]
  assert attention.keys.shape == (2, 8, 2, 16) and attention.queries.shape == (2, 32, 2, 16)
  sums = attention.probabilities.sum(-1)
  np.testing.assert_allclose(sums[padding_mask.nonzero()[0], :, padding_mask.nonzero()[1]], 1.0)
  np.testing.assert_array_equal(sums[0, :, ~padding_mask[0]], 0.0)  # padded queries


@pytest.mark.filterwarnings('ignore:encode cut')  # TEXTS[1] fills n
def test_a_transformers_attention_is_over_the_n_real_keys():
  config = tiny.get_config()
  config.model.attention = 'full'
  run = linformer_jax.build(config)
  token_ids, padding_mask = run.encode(TEXTS, padding='max_length')
  probabilities = run.attention(token_ids, 0, padding_mask).probabilities
  assert probabilities.shape == (2, 2, 32, 32)
  real = padding_mask[0].sum()
  np.testing.assert_allclose(probabilities[0, :, :real].sum(-1), 1.0)
  np.testing.assert_array_equal(probabilities[0, :, :, real:], 0.0)  # padded keys


@pytest.mark.filterwarnings('ignore:encode cut')  # TEXTS[1] fills n
def test_a_real_tokens_logits_do_not_depend_on_padding(loaded):
  token_ids, padding_mask = loaded.encode(TEXTS, padding='max_length')
  real = padding_mask[0].sum()
  alone = loaded.logits(token_ids[:1, :real])
  batched = loaded.logits(token_ids, padding_mask)
  np.testing.assert_allclose(batched[0, :real], alone[0], rtol=1e-5, atol=1e-5)


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
