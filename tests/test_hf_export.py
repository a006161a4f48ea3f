"""Exporting runs as Hugging Face folders (`checkpoints.hf_export`), and reading them back.

Each case is a tiny model (configs/tiny.py's sizes: 2 layers, 32 wide, n =
32) built fresh with `linformer_jax.build`, its variables moved by noise so
that every one of them (biases, norms, E/F) counts. One module fixture
exports them all, and one fresh offline process of .venv-hf (torch and
transformers: `make venv-hf`) loads every folder with its task's auto class
and AutoTokenizer (tests/hf_folder_worker.py). Its float32 logits on a padded
batch of rows of different lengths must agree with `Run.logits` within 1e-4
of max |logit|, at the real tokens; AutoTokenizer must give the run's ids;
a masked-LM folder imports back (`import_checkpoint`) and loads back
(`linformer_jax.load`) bitwise.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess

import jax
import numpy as np
import pytest

from configs import causal_lm
from configs import classification
from configs import imported
from configs import tiny
import linformer_jax
from linformer_jax import extensions
from linformer_jax import registry
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_conversion
from linformer_jax.checkpoints import hf_export
from linformer_jax.checkpoints import hf_tensors
from linformer_jax.data import encoding
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.training import hf_import

REPO = pathlib.Path(__file__).resolve().parent.parent
HF_PYTHON = REPO / '.venv-hf' / 'bin' / 'python'
WORKER = REPO / 'tests' / 'hf_folder_worker.py'
FIXTURES = REPO / 'tests' / 'fixtures' / 'hf'
TOLERANCE = 1e-4
TEXTS = [
    'def main():',
    'import os  # the operating system, and a comment longer than n',
    'x = 1',
    'héllo wörld',
]
PAIRS = [('the best of times', 'the worst of times')]
LABELS = ('negative', 'positive', 'neither')
# name -> (config.task, config.model fields, tokenizer, the class transformers loads).
CASES = {
    'none-linear-k-per-layer': (
        'masked_lm',
        dict(sharing='none', projected_len=(8, 4)),
        'byte',
        'LinformerForMaskedLM',
    ),
    'headwise-linear-pre-ln': (
        'masked_lm',
        dict(sharing='headwise', pre_layer_norm=True),
        'byte',
        'LinformerForMaskedLM',
    ),
    'kv-linear-scanned': (
        'masked_lm',
        dict(sharing='kv', scan_layers=True),
        'byte',
        'LinformerForMaskedLM',
    ),
    'layerwise-linear-segments': (
        'masked_lm',
        dict(sharing='layerwise', num_segments=2),
        'byte',
        'LinformerForMaskedLM',
    ),
    'mean': (
        'masked_lm',
        dict(projection='mean', sharing='headwise'),
        'byte',
        'LinformerForMaskedLM',
    ),
    'max': (
        'masked_lm',
        dict(projection='max', sharing='none', projected_len=(4, 8)),
        'byte',
        'LinformerForMaskedLM',
    ),
    'conv': ('masked_lm', dict(projection='conv', sharing='none'), 'byte', 'LinformerForMaskedLM'),
    'random': (
        'masked_lm',
        dict(projection='random', sharing='kv'),
        'byte',
        'LinformerForMaskedLM',
    ),
    'transformer-roberta': (
        'masked_lm',
        dict(attention='full'),
        'huggingface',
        'RobertaForMaskedLM',
    ),
    'transformer-bert': (
        'masked_lm',
        dict(attention='full', num_segments=2),
        'sentencepiece',
        'BertForMaskedLM',
    ),
    'classifier': (
        'classification',
        dict(pooling='attention', sharing='headwise'),
        'byte',
        'LinformerForSequenceClassification',
    ),
    'classifier-roberta': (
        'classification',
        dict(attention='full', pooling='first'),
        'byte',
        'RobertaForSequenceClassification',
    ),
    'causal-linear': (
        'causal_lm',
        dict(causal=True, block_len=8, projected_len=4, sharing='none'),
        'byte',
        'LinformerForCausalLM',
    ),
    'causal-conv': (
        'causal_lm',
        dict(causal=True, block_len=8, projected_len=4, projection='conv', sharing='headwise'),
        'byte',
        'LinformerForCausalLM',
    ),
}
MASKED_LM_CASES = [name for name, case in CASES.items() if case[0] == 'masked_lm']


def case_config(task, model_fields, tokenizer_kind, vocab_size):
  """configs/tiny.py's model and byte tokenizer under the task's config."""
  base = {'masked_lm': tiny, 'classification': classification, 'causal_lm': causal_lm}[task]
  config = base.get_config()
  with config.model.ignore_type():  # projected_len may be one k per layer
    config.model.update({**tiny.get_config().model.to_dict(), **model_fields})
  config.model.vocab_size = config.data.vocab_size = vocab_size
  config.data.tokenizer = tokenizer_kind
  if task == 'classification':
    config.data.labels = LABELS
  return config


def padded_rows(tokenizer, texts, max_len):
  """(ids, mask) of `[bos] text [eos]` rows padded to max_len, as Run.encode makes them."""
  rows = [encoding.encode_texts([text], tokenizer, max_len)[0] for text in texts]
  ids = np.full((len(rows), max_len), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(rows), max_len), bool)
  for row, row_ids in enumerate(rows):
    ids[row, : len(row_ids)], mask[row, : len(row_ids)] = row_ids, True
  return ids, mask


def moved(variables, seed):
  """Every variable plus N(0, 0.05^2) noise, so that none keeps its initial value."""
  rng = np.random.default_rng(seed)
  noise = lambda x: np.asarray(x) + rng.normal(0.0, 0.05, np.shape(x)).astype(np.float32)
  return jax.tree_util.tree_map(noise, variables)


@pytest.fixture(scope='module')
def tokenizers(tmp_path_factory):
  """The three kinds of tokenizer a run keeps: bytes, a SentencePiece model
  (trained here on the docs, 300 pieces) and a Hugging Face tokenizer.json
  (the RoBERTa fixture's, 300 tokens, pad id 1)."""
  lines = [
      line
      for page in sorted((REPO / 'docs').glob('*.md'))[:8]
      for line in page.read_text().splitlines()
      if line.strip()
  ]
  model = tmp_path_factory.mktemp('sentencepiece') / 'tokenizer.model'
  return {
      'byte': tokenizer_lib.ByteTokenizer(),
      'sentencepiece': tokenizer_lib.SentencePieceTokenizer.train(iter(lines), 300, str(model)),
      'huggingface': tokenizer_lib.HuggingFaceTokenizer(
          str(FIXTURES / 'roberta' / 'tokenizer.json')
      ),
  }


@pytest.fixture(scope='module')
def exported(tmp_path_factory, tokenizers):
  """name -> (run, folder, summary, JAX logits, the inputs' padding mask,
  torch logits, what the worker read): every case exported, and loaded by
  transformers once."""
  if not HF_PYTHON.exists():
    pytest.fail(
        f'{HF_PYTHON} is missing: the export is checked against torch and transformers in '
        'an environment of their own; run `make venv-hf` first.'
    )
  root = tmp_path_factory.mktemp('exported')
  built, worker_cases = {}, {}
  for seed, (name, (task, fields, tokenizer_kind, _)) in enumerate(CASES.items()):
    tokenizer = tokenizers[tokenizer_kind]
    run = linformer_jax.build(case_config(task, fields, tokenizer_kind, tokenizer.vocab_size))
    run = dataclasses.replace(run, variables=moved(run.variables, seed), tokenizer=tokenizer)
    folder = root / name
    summary = hf_export.export_folder(run.config, run.variables, tokenizer, str(folder))
    ids, mask = padded_rows(tokenizer, TEXTS, run.model_config.max_len)
    logits = np.asarray(run.logits(ids, mask))
    np.savez(root / f'{name}.npz', input_ids=ids, attention_mask=mask)
    worker_cases[name] = {
        'folder': str(folder),
        'auto_class': summary['auto_class'],
        'inputs': str(root / f'{name}.npz'),
        'logits': str(root / f'{name}.logits.npy'),
        'texts': TEXTS,
        'pairs': PAIRS if run.model_config.num_segments >= 2 else [],
    }
    built[name] = (run, folder, summary, logits, mask)
  (root / 'cases.json').write_text(json.dumps(worker_cases))
  offline = {'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'HF_HOME': str(root / 'hf_home')}
  result = subprocess.run(
      [str(HF_PYTHON), str(WORKER), str(root / 'cases.json'), str(root / 'results.json')],
      env={**os.environ, **offline},
      stdin=subprocess.DEVNULL,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  read = json.loads((root / 'results.json').read_text())
  return {name: built[name] + (np.load(worker_cases[name]['logits']), read[name]) for name in CASES}


@pytest.mark.parametrize('name', list(CASES))
def test_the_auto_class_loads_the_folder_and_gives_the_jax_logits(exported, name):
  run, folder, summary, ours, mask, theirs, read = exported[name]
  assert read['class'] == summary['class'] == CASES[name][3]
  assert summary['remote_code'] == (folder / 'modeling_linformer.py').exists()
  assert summary['remote_code'] == CASES[name][3].startswith('Linformer')
  assert theirs.shape == ours.shape
  if ours.ndim == 3:  # a language model's logits at the real tokens; padding's mean nothing
    ours, theirs = ours[mask], theirs[mask]
  assert not mask.all() and len(set(mask.sum(axis=1))) > 1, 'rows of different lengths'
  error = np.abs(ours - theirs).max() / np.abs(ours).max()
  assert error < TOLERANCE, f'{name}: max |torch - jax| / max |jax| = {error:.2e}'
  if run.config.task == 'classification':
    config = json.loads((folder / 'config.json').read_text())
    assert config['id2label'] == {str(i): label for i, label in enumerate(LABELS)}


@pytest.mark.parametrize(
    'name',
    ['layerwise-linear-segments', 'transformer-roberta', 'transformer-bert', 'causal-linear'],
)
def test_auto_tokenizer_gives_the_runs_token_ids(exported, name):
  run, _, _, _, _, _, read = exported[name]
  tokenizer = run.tokenizer
  max_len = run.model_config.max_len
  if run.config.task == 'causal_lm':  # a prompt, as the run's generation frames it
    expected = [([tokenizer.bos_id] + tokenizer.encode(text))[:max_len] for text in TEXTS]
  else:
    expected = [encoding.encode_texts([text], tokenizer, max_len)[0] for text in TEXTS]
  assert read['ids'] == expected
  for (first, second), (ids, segments) in zip(PAIRS, read['pairs']):
    assert [ids, segments] == list(encoding.encode_texts([first, second], tokenizer, max_len))


@pytest.mark.parametrize('name', MASKED_LM_CASES)
def test_a_masked_lm_folder_imports_back_bitwise(exported, name):
  run, folder, summary, _, _, _, _ = exported[name]
  checkpoint = hf_checkpoint.read_folder(str(folder))
  original = run.model_config
  config = imported.get_config()
  for flag in summary['import_flags']:  # RoBERTa's and BERT's max_len and k are the config's
    field, value = flag.removeprefix('--config.model.').split('=')
    config.model[field] = int(value)
  config = hf_conversion.imported_config(config, checkpoint)
  for field in ('num_segments', 'pre_layer_norm', 'projection', 'sharing', 'max_len'):
    assert config.model[field] == getattr(original, field), field
  if checkpoint.architecture == 'linformer':
    assert tuple(np.atleast_1d(config.model.projected_len)) == tuple(
        np.atleast_1d(original.projected_len)
    )
  _, state, kept = hf_import.build_state(config, checkpoint)
  assert kept == [] and hf_tensors.unused_tensors(checkpoint) == (
      ['roberta.embeddings.token_type_embeddings.weight'] if name == 'transformer-roberta' else []
  )
  variables = run.variables
  if original.scan_layers:
    variables = hf_export._unscanned(variables, original.num_layers)
  ours = hf_tensors.flat_variables(variables)
  theirs = hf_tensors.flat_variables({'params': state.params, **state.constants})
  assert sorted(ours) == sorted(theirs)
  for path, value in ours.items():
    assert theirs[path].dtype == np.float32
    np.testing.assert_array_equal(theirs[path], value, err_msg='/'.join(path))


def test_the_import_writes_a_linformer_folder_as_a_run_that_loads(exported, tmp_path):
  run, folder, _, logits, mask, _, _ = exported['random']
  workdir = tmp_path / 'imported'
  config, summary = hf_import.import_checkpoint(str(folder), str(workdir), imported.get_config())
  assert summary['architecture'] == 'linformer' and summary['initialised_parameters'] == []
  assert config.model.projection == 'random' and config.model.max_len == 32
  loaded = linformer_jax.load(str(workdir))
  flat = hf_tensors.flat_variables
  assert sorted(flat(loaded.variables)) == sorted(flat(run.variables))
  for path, value in flat(run.variables).items():
    np.testing.assert_array_equal(flat(loaded.variables)[path], value, err_msg='/'.join(path))
  ids, _ = padded_rows(run.tokenizer, TEXTS, 32)
  np.testing.assert_array_equal(np.asarray(loaded.logits(ids, mask))[mask], logits[mask])
  assert loaded.encode(TEXTS)[0].tolist() == ids.tolist()


def test_a_folder_of_another_head_is_not_imported(exported, tmp_path):
  for name in ('classifier', 'causal-linear'):
    folder = exported[name][1]
    with pytest.raises(ConfigError, match='the import reads a masked LM') as error:
      hf_import.import_checkpoint(str(folder), str(tmp_path / name), imported.get_config())
    assert '\n' not in str(error.value) and not (tmp_path / name).exists()


def extension_config(path, **model):
  """configs/tiny.py with the extension file `path` imported and model fields set."""
  config = tiny.get_config()
  config.extensions = (path,)
  extensions.import_extensions(config.extensions)
  registry.add_declared_settings(config)
  config.model.update(model)
  return config


@pytest.mark.parametrize(
    'change,message',
    [
        (
            lambda c: c.model.update(attention='performer', attention_dropout_rate=0.0),
            "attention='performer' has no PyTorch",
        ),
        (
            lambda c: extension_config(
                'docs/examples/tempered_attention.py', attention='tempered_linformer'
            ),
            "attention='tempered_linformer' is an extension's attention kind",
        ),
        (
            lambda c: extension_config('docs/examples/strided_projection.py', projection='strided'),
            "projection='strided' is an extension's projection",
        ),
        (lambda c: c.update(task='shuffled_text'), "task='shuffled_text' has no Hugging Face head"),
        (lambda c: c.data.update(vocab_size=300), 'The tokenizer has 260 tokens'),
    ],
)
def test_what_cannot_be_exported_is_refused_in_one_line_with_nothing_written(
    tmp_path, change, message
):
  config = tiny.get_config()
  config = change(config) or config
  config.model.vocab_size = config.data.vocab_size
  with pytest.raises(ConfigError, match=message) as error:
    hf_export.export_folder(config, {}, tokenizer_lib.ByteTokenizer(), str(tmp_path / 'out'))
  assert '\n' not in str(error.value)
  assert os.listdir(tmp_path) == []


def test_a_used_folder_is_refused_and_left_as_it_was(exported, tmp_path):
  run = exported['mean'][0]
  (tmp_path / 'notes.txt').write_text('mine')
  with pytest.raises(ConfigError, match='already exists and is not empty'):
    hf_export.export_folder(run.config, run.variables, run.tokenizer, str(tmp_path))
  assert os.listdir(tmp_path) == ['notes.txt']
  empty = tmp_path / 'empty'
  empty.mkdir()
  summary = hf_export.export_folder(run.config, run.variables, run.tokenizer, str(empty))
  assert sorted(os.listdir(empty)) == sorted(summary['files'])
  assert sorted(os.listdir(tmp_path)) == ['empty', 'notes.txt']


def _offline_torch(script: pathlib.Path, root: pathlib.Path) -> subprocess.CompletedProcess:
  """Runs `script` in .venv-hf, offline, as a user of an exported folder would."""
  offline = {'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1', 'HF_HOME': str(root / 'hf_home')}
  return subprocess.run(
      [str(HF_PYTHON), str(script)],
      env={**os.environ, **offline},
      stdin=subprocess.DEVNULL,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )


def test_the_docs_fill_mask_snippet_runs_on_an_exported_folder(exported, tmp_path):
  text = (REPO / 'docs' / 'checkpoint_import.md').read_text()
  blocks = [b for b in re.findall(r'```python\n(.*?)```', text, flags=re.S) if 'fill-mask' in b]
  assert len(blocks) == 1, 'docs/checkpoint_import.md: one PyTorch fill-mask snippet'
  assert "'exported/gutenberg'" in blocks[0]
  _, folder, *_ = exported['headwise-linear-pre-ln']
  script = tmp_path / 'fill_mask.py'
  script.write_text(blocks[0].replace("'exported/gutenberg'", repr(str(folder))))
  result = _offline_torch(script, tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  guesses = result.stdout.strip().splitlines()
  assert len(guesses) == 3 and all(0 < float(line.split()[0]) <= 1 for line in guesses), guesses


def test_the_command_exports_a_trained_run_that_imports_back_bitwise(
    tiny_run, tmp_path, run_command
):
  workdir, _ = tiny_run
  out = tmp_path / 'exported'
  process = run_command('export_checkpoint', f'--workdir={workdir}', f'--out={out}')
  assert process.returncode == 0, process.stderr
  assert 'LinformerForMaskedLM (remote code)' in process.stdout
  read_back = tmp_path / 'read_back'
  process = run_command(
      'import_checkpoint',
      f'--from={out}',
      f'--workdir={read_back}',
      '--config=configs/imported.py',
  )
  assert process.returncode == 0, process.stderr
  ours = hf_tensors.flat_variables(linformer_jax.load(workdir).variables)
  theirs = hf_tensors.flat_variables(linformer_jax.load(str(read_back)).variables)
  assert sorted(ours) == sorted(theirs)
  for path, value in ours.items():
    np.testing.assert_array_equal(theirs[path], value, err_msg='/'.join(path))
  # A second export into the same folder is refused in one line, the folder kept.
  before = sorted(path.name for path in out.iterdir())
  process = run_command('export_checkpoint', f'--workdir={workdir}', f'--out={out}')
  assert process.returncode == 2 and 'Traceback' not in process.stderr, process.stderr
  assert process.stderr.strip().splitlines()[-1].startswith('error: '), process.stderr
  assert sorted(path.name for path in out.iterdir()) == before


@pytest.mark.parametrize('name', ['none-linear-k-per-layer', 'transformer-roberta'])
def test_load_reads_a_masked_lm_folder_back_as_the_run(exported, name):
  run, folder, _, logits, mask, _, _ = exported[name]
  loaded = linformer_jax.load(str(folder))
  assert (loaded.step, loaded.workdir, loaded.config.task) == (0, None, 'masked_lm')
  # RoBERTa's n comes from its position table, past the padding offset.
  assert loaded.model_config.max_len == run.model_config.max_len == 32
  flat = hf_tensors.flat_variables
  ours, theirs = flat(run.variables), flat(loaded.variables)
  assert sorted(ours) == sorted(theirs)
  for path, value in ours.items():
    np.testing.assert_array_equal(theirs[path], value, err_msg='/'.join(path))
  ids, _ = padded_rows(run.tokenizer, TEXTS, 32)
  assert loaded.encode(TEXTS)[0].tolist() == ids.tolist()
  np.testing.assert_array_equal(np.asarray(loaded.logits(ids, mask))[mask], logits[mask])


def test_load_refuses_another_head_a_bogus_folder_or_a_step_in_one_line(exported, tmp_path):
  gpt2 = tmp_path / 'gpt2'
  gpt2.mkdir()
  (gpt2 / 'config.json').write_text(json.dumps({'model_type': 'gpt2', 'n_layer': 2}))
  no_kind = tmp_path / 'no_kind'
  no_kind.mkdir()
  (no_kind / 'config.json').write_text(json.dumps({'hidden_size': 32, 'layers': [1, 2]}))
  refusals = [
      (exported['classifier'][1], None, 'the import reads a masked LM (LinformerForMaskedLM)'),
      (exported['classifier-roberta'][1], None, 'cannot map, e.g. classifier.'),
      (exported['causal-linear'][1], None, 'a classifier or causal LM folder'),
      (gpt2, None, 'has no tokenizer.json'),
      (no_kind, None, "is not a run's config"),
      (exported['mean'][1], 1, 'holds one set of weights and no data; load it without step'),
      (FIXTURES / 'roberta', None, 'was not exported from a run'),  # RoBERTa from elsewhere
  ]
  for folder, step, message in refusals:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
      linformer_jax.load(str(folder), step=step)
    assert '\n' not in str(error.value), error.value
