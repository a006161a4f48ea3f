"""Importing Hugging Face RoBERTa and BERT checkpoints (`import_checkpoint`).

The fixtures in tests/fixtures/hf are tiny random RobertaForMaskedLM and
BertForMaskedLM models with their outputs, made once by
tests/fixtures/hf/make_fixtures.py (torch and transformers are not needed
here). Parity is measured as max |ours - theirs| over the real tokens,
relative to max |theirs|; a float32 model must be within 1e-5.
"""

import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.numpy

from configs import finetune_sst2
from configs import from_workdir
from configs import imported
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_conversion
from linformer_jax.data import encoding
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.training import hf_import
from linformer_jax.training import run_builder
from linformer_jax.training import run_loading
from linformer_jax.training import training_run

FIXTURES = pathlib.Path(__file__).resolve().parent / 'fixtures' / 'hf'
ARCHITECTURES = ('roberta', 'bert')
TOLERANCE = 1e-5
TEXT = 'It was the best of times, it was the worst of times.\n' * 40


def import_config(**model):
  """configs/imported.py at the fixtures' size: n = 64, k = 16, float32."""
  config = imported.get_config()
  config.model.max_len = 64
  config.model.projected_len = 16
  config.model.update(model)
  config.batch_size = config.eval_batch_size = 4
  return config


@pytest.fixture(scope='module')
def imports():
  """(name, attention) -> (checkpoint, config, parts, state, kept, expected), each built once."""
  built = {}

  def get(name, attention='full'):
    if (name, attention) not in built:
      checkpoint = hf_checkpoint.read_folder(str(FIXTURES / name))
      config = hf_conversion.imported_config(import_config(attention=attention), checkpoint)
      parts, state, kept = hf_import.build_state(config, checkpoint)
      expected = dict(np.load(FIXTURES / name / 'expected.npz'))
      built[name, attention] = (checkpoint, config, parts, state, kept, expected)
    return built[name, attention]

  return get


def relative_error(ours, theirs, real):
  ours, theirs = np.asarray(ours)[real], np.asarray(theirs)[real]
  return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def forward(parts, state, ids, mask, **kwargs):
  """(logits, [embedding output, each layer's output]) of the masked-LM model."""
  logits, captured = parts.model.apply(
      state.variables(),
      jnp.asarray(ids),
      jnp.asarray(mask, bool),
      capture_intermediates=True,
      mutable=['intermediates'],
      **kwargs,
  )
  encoder = captured['intermediates']['encoder']
  layers = [encoder[f'layers_{i}']['__call__'][0] for i in range(parts.model_config.num_layers)]
  return logits, [encoder['embedding_norm']['__call__'][0]] + layers


@pytest.mark.parametrize('name', ARCHITECTURES)
def test_logits_and_hidden_states_match_hugging_face_on_padded_inputs(imports, name):
  _, _, parts, state, _, expected = imports(name)
  real = expected['attention_mask'].astype(bool)
  assert not real.all(), 'the inputs must hold padding'
  logits, hidden = forward(parts, state, expected['input_ids'], real)
  assert relative_error(logits, expected['logits'], real) < TOLERANCE
  assert len(hidden) == len(expected['hidden_states'])
  for layer, (ours, theirs) in enumerate(zip(hidden, expected['hidden_states'])):
    assert relative_error(ours, theirs, real) < TOLERANCE, f'layer {layer}'


def test_bert_token_types_match_hugging_face(imports):
  _, _, parts, state, _, expected = imports('bert')
  real = expected['pair_attention_mask'].astype(bool)
  logits, _ = forward(
      parts,
      state,
      expected['pair_input_ids'],
      real,
      segments=jnp.asarray(expected['token_type_ids']),
  )
  assert relative_error(logits, expected['pair_logits'], real) < TOLERANCE


def test_the_linformer_import_adds_only_e_and_f_initialised_as_the_model_does(imports):
  _, _, _, full_state, full_kept, _ = imports('roberta')
  checkpoint, config, parts, state, kept, expected = imports('roberta', 'linformer')
  assert full_kept == [] and kept == ['encoder/shared_projection/kv_projection']
  flat = lambda tree: {
      jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)
  }
  linformer, transformer = flat(state.params), flat(full_state.params)
  assert set(linformer) - set(transformer) == {"['encoder']['shared_projection']['kv_projection']"}
  for path, value in transformer.items():
    np.testing.assert_array_equal(linformer[path], value, err_msg=path)
  fresh = jax.jit(parts.model.init)(jax.random.PRNGKey(config.seed), jnp.ones((1, 64), jnp.int32))
  projection = fresh['params']['encoder']['shared_projection']['kv_projection'].unbox()
  np.testing.assert_array_equal(
      state.params['encoder']['shared_projection']['kv_projection'], projection
  )
  real = expected['attention_mask'].astype(bool)
  logits, _ = forward(parts, state, expected['input_ids'], real)
  assert logits.shape == expected['logits'].shape and np.isfinite(logits).all()
  assert checkpoint.architecture == 'roberta'


@pytest.mark.parametrize(
    'name,roles',
    [
        ('roberta', dict(bos_id=0, pad_id=1, eos_id=2, unk_id=3, mask_id=299)),
        ('bert', dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3, mask_id=4)),
    ],
)
def test_the_tokenizer_gives_hugging_face_ids_and_round_trips(name, roles):
  tokenizer = tokenizer_lib.HuggingFaceTokenizer(str(FIXTURES / name / 'tokenizer.json'))
  assert {role: getattr(tokenizer, role) for role in roles} == roles
  assert set(roles.values()) <= set(tokenizer.special_ids)
  expected = np.load(FIXTURES / name / 'expected.npz')
  for text, ids, mask in zip(expected['texts'], expected['input_ids'], expected['attention_mask']):
    ours, _ = encoding.encode_texts([str(text)], tokenizer, seq_len=64)
    assert ours == ids[mask.astype(bool)].tolist(), text
  assert tokenizer.encode_all([str(t) for t in expected['texts']]) == [
      tokenizer.encode(str(t)) for t in expected['texts']
  ]
  text = str(expected['texts'][1])
  decoded = tokenizer.decode(tokenizer.encode(text))
  assert decoded == (text if name == 'roberta' else text.lower())


def test_pairs_are_laid_out_as_the_checkpoints_tokenizer_does():
  tokenizer = tokenizer_lib.HuggingFaceTokenizer(str(FIXTURES / 'bert' / 'tokenizer.json'))
  expected = np.load(FIXTURES / 'bert' / 'expected.npz')
  texts = [str(t) for t in expected['texts']]
  for row, pair in enumerate(zip(texts[:2], texts[1:])):
    ids, segments = encoding.encode_texts(list(pair), tokenizer, seq_len=64)
    real = expected['pair_attention_mask'][row].astype(bool)
    assert ids == expected['pair_input_ids'][row][real].tolist()
    assert segments == expected['token_type_ids'][row][real].tolist()
  roberta = tokenizer_lib.HuggingFaceTokenizer(str(FIXTURES / 'roberta' / 'tokenizer.json'))
  assert roberta.pair_separator == (roberta.eos_id, roberta.eos_id)


def text_data(config, folder):
  """`config` reading two small text files: validation.txt and train.txt."""
  folder.mkdir(exist_ok=True)
  for split in ('train', 'validation'):
    (folder / f'{split}.txt').write_text(TEXT)
  config.data.source = 'text_files'
  config.data.path = str(folder)
  config.data.split_files = {'validation': ('validation.txt',)}
  config.data.max_eval_batches = 1
  return config


@pytest.mark.long
@pytest.mark.slow
def test_the_imported_run_evaluates_and_starts_other_runs(imports, tmp_path):
  _, _, _, state, _, _ = imports('bert')
  workdir = tmp_path / 'bert'
  config, summary = hf_import.import_checkpoint(
      str(FIXTURES / 'bert'), str(workdir), import_config()
  )
  assert sorted(os.listdir(tmp_path)) == ['bert']
  assert sorted(os.listdir(workdir)) == [
      'checkpoints',
      'config.json',
      'import.json',
      'tokenizer.json',
  ]
  assert json.loads((workdir / 'import.json').read_text())['architecture'] == 'bert'
  assert summary['model_fields']['layer_norm_epsilon'] == 1e-12
  lines = hf_import.describe(summary, str(workdir))
  assert lines[0].startswith(f'Imported bert from {FIXTURES / "bert"} into {workdir} (step 0)')
  assert f'--config configs/from_workdir.py:{workdir}' in lines[-2]
  assert f'--config configs/finetune_sst2.py:{workdir}' in lines[-1]
  saved = text_data(from_workdir.get_config(str(workdir)), tmp_path / 'text')
  assert saved.model.to_dict() == config.model.to_dict()

  loaded = run_loading.load_run(saved, str(workdir), with_data=True)
  assert loaded.step == 0 and isinstance(loaded.data.tokenizer, tokenizer_lib.HuggingFaceTokenizer)
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded.variables['params'], state.params)
  assert np.isfinite(loaded.evaluate()['loss'])

  continued = ml_collections.ConfigDict(saved.to_dict())
  continued.init_from = str(workdir)
  run = training_run.TrainingRun(run_builder.build_parts(continued), str(tmp_path / 'continued'))
  run.store.close()
  jax.tree_util.tree_map(np.testing.assert_array_equal, run.state.params, state.params)
  assert (tmp_path / 'continued' / 'tokenizer.json').read_bytes() == (
      workdir / 'tokenizer.json'
  ).read_bytes()

  finetune = finetune_sst2.get_config(str(workdir))  # configs/finetune_sst2.py:RUN
  assert finetune.model.layer_norm_epsilon == 1e-12 and finetune.model.num_segments == 2
  assert finetune.data.tokenizer == 'huggingface' and finetune.model.pooling == 'mean'
  (tmp_path / 'tsv').mkdir()
  for split in ('train', 'dev'):
    rows = ''.join(f'the best of times\t{i % 2}\n' for i in range(8))
    (tmp_path / 'tsv' / f'{split}.tsv').write_text('sentence\tlabel\n' + rows)
  finetune.data.update(path=str(tmp_path / 'tsv'), max_eval_batches=1)
  finetune.data.split_files = {'train': ('train.tsv',), 'validation': ('dev.tsv',)}
  finetune.update(init_from=str(workdir), batch_size=4, eval_batch_size=4)
  run = training_run.TrainingRun(run_builder.build_parts(finetune), str(tmp_path / 'finetuned'))
  run.store.close()
  jax.tree_util.tree_map(
      np.testing.assert_array_equal, run.state.params['encoder'], state.params['encoder']
  )


def copy_fixture(tmp_path, name='roberta'):
  folder = tmp_path / 'source'
  shutil.copytree(FIXTURES / name, folder)
  return folder


def edit_config(folder, **fields):
  config = json.loads((folder / 'config.json').read_text())
  config.update(fields)
  (folder / 'config.json').write_text(json.dumps(config))


def edit_tensors(folder, drop=(), **replace):
  tensors = safetensors.numpy.load_file(str(folder / 'model.safetensors'))
  tensors = {k: v for k, v in tensors.items() if k not in drop}
  tensors.update(replace)
  safetensors.numpy.save_file(tensors, str(folder / 'model.safetensors'))


def missing_folder(folder):
  shutil.rmtree(folder)


def other_architecture(folder):
  edit_config(folder, model_type='gpt2', architectures=['GPT2LMHeadModel'])


def relative_positions(folder):
  edit_config(folder, position_embedding_type='relative_key')


def approximate_gelu(folder):
  edit_config(folder, hidden_act='gelu_new')


def config_weights_mismatch(folder):
  edit_config(folder, intermediate_size=48)


def missing_tensor(folder):
  edit_tensors(folder, drop=('lm_head.dense.weight',))


def untied_decoder(folder):
  edit_tensors(folder, **{'lm_head.decoder.weight': np.ones((300, 32), np.float32)})


def other_tokenizer(folder):
  shutil.copyfile(FIXTURES / 'bert' / 'tokenizer.json', folder / 'tokenizer.json')


def tokenizer_without_mask(folder):
  tokenizer = json.loads((folder / 'tokenizer.json').read_text())
  tokenizer['added_tokens'] = [t for t in tokenizer['added_tokens'] if t['content'] != '<mask>']
  (folder / 'tokenizer.json').write_text(json.dumps(tokenizer))


def unknown_tensor(folder):
  edit_tensors(
      folder,
      **{
          'roberta.encoder.layer.0.attention.self.distance_embedding.weight': np.ones(
              (3, 4), np.float32
          )
      },
  )


def test_sharded_weights_and_old_layer_norm_names_read_as_one_file(tmp_path):
  source = copy_fixture(tmp_path)
  tensors = safetensors.numpy.load_file(str(source / 'model.safetensors'))
  names = sorted(tensors)
  saved = {name.replace('LayerNorm.weight', 'LayerNorm.gamma'): tensors[name] for name in names}
  weight_map = {}
  for shard, part in enumerate((sorted(saved)[::2], sorted(saved)[1::2])):
    filename = f'model-{shard + 1:05d}-of-00002.safetensors'
    safetensors.numpy.save_file({name: saved[name] for name in part}, str(source / filename))
    weight_map.update(dict.fromkeys(part, filename))
  (source / 'model.safetensors').unlink()
  (source / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': weight_map}))
  sharded = hf_checkpoint.read_folder(str(source))
  assert sorted(sharded.tensors) == names
  for name in names:
    np.testing.assert_array_equal(sharded.tensors[name], tensors[name])


@pytest.mark.parametrize(
    'damage,message',
    [
        (missing_folder, 'no such folder'),
        (other_architecture, "unsupported architecture model_type='gpt2'"),
        (relative_positions, "position_embedding_type='relative_key'"),
        (approximate_gelu, "hidden_act='gelu_new'"),
        (
            config_weights_mismatch,
            r'intermediate.dense.weight has shape \(64, 32\), but config.json',
        ),
        (missing_tensor, 'no tensor lm_head.dense.weight'),
        (untied_decoder, 'lm_head.decoder.weight differs'),
        (other_tokenizer, 'tokenizer.json has 200 tokens, config.json vocab_size=300'),
        (tokenizer_without_mask, 'exactly one of the tokens <mask> or .MASK. .found 0.'),
        (unknown_tensor, 'cannot map, e.g. roberta.encoder.layer.0.attention.self.distance'),
    ],
)
def test_a_checkpoint_that_cannot_be_imported_is_refused_with_nothing_written(
    tmp_path, damage, message
):
  source = copy_fixture(tmp_path)
  damage(source)
  with pytest.raises(ConfigError, match=message):
    hf_import.import_checkpoint(str(source), str(tmp_path / 'run'), import_config())
  assert sorted(os.listdir(tmp_path)) == ([] if damage is missing_folder else ['source'])


def test_a_run_that_is_too_long_or_a_used_workdir_is_refused(tmp_path):
  with pytest.raises(ConfigError, match='max_len=512 is longer than the 64 positions'):
    hf_import.import_checkpoint(
        str(FIXTURES / 'roberta'), str(tmp_path / 'run'), import_config(max_len=512)
    )
  (tmp_path / 'used').mkdir()
  (tmp_path / 'used' / 'notes.txt').write_text('mine')
  with pytest.raises(ConfigError, match='already exists'):
    hf_import.import_checkpoint(str(FIXTURES / 'roberta'), str(tmp_path / 'used'), import_config())
  assert sorted(os.listdir(tmp_path)) == ['used']


def test_a_hub_name_without_the_hub_says_to_download_the_folder(monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  with pytest.raises(ConfigError, match='download the folder'):
    hf_conversion.resolve_source('linformer-jax-tests/no-such-model')


@pytest.mark.slow
def test_the_command_imports_or_fails_with_one_line_and_exit_2(tmp_path, run_command):
  source = copy_fixture(tmp_path)
  flags = ['--config', 'configs/imported.py', '--config.model.max_len=64']
  flags.append('--config.model.projected_len=16')
  result = run_command('import_checkpoint', '--from', source, '--workdir', tmp_path / 'run', *flags)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f'Imported roberta from {source} into {tmp_path / "run"}')
  assert (tmp_path / 'run' / 'checkpoints' / '0').is_dir()
  approximate_gelu(source)
  result = run_command('import_checkpoint', '--from', source, '--workdir', tmp_path / 'new', *flags)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"error: --from={source}: unsupported architecture: hidden_act='gelu_new': only exact "
      'GELU (gelu) is supported.'
  ]
  assert sorted(os.listdir(tmp_path)) == ['run', 'source']
