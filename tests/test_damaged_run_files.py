"""Damaged files of a run folder (issue 58, item 2), other than sealed steps.

Every file of the run folder that a command reads back is read defensively:
it is used, an older step stands in for it, or one line names the file and
the fix. Here: a sound-step ledger that is not a ledger, a step written
without an integrity manifest whose files are cut short or missing, a file
where the checkpoint folder, an unfinished save's folder or the folder of
damaged steps belongs, a protected marker made as a folder, and a gs:// lock
object another program wrote. (Sealed steps with a manifest:
tests/test_damaged_steps.py and tests/test_reliability.py.)
"""

import glob
import json
import os
import pathlib
import re
import shutil

from conftest import REPO_ROOT
import jax
import jax.numpy as jnp
import pytest
from run_helpers import folder_contents
from run_helpers import one_error_line
from run_helpers import tiny_config
from run_helpers import tiny_flags

import linformer_jax
from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.analysis import sweep_report
from linformer_jax.checkpoints import step_files
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.data import tokenizer_files
from linformer_jax.errors import ConfigError
from linformer_jax.training import metric_writers
from linformer_jax.training import run_loading
from linformer_jax.training import sound_steps
from linformer_jax.training import trainer
from linformer_jax.training import workdir_lock


def _warnings(caplog, words):
  return [r.getMessage() for r in caplog.records if words in r.getMessage()]


# --- The sound-step ledger -------------------------------------------------

LEDGERS = {
    'not JSON': '{"steps": {',
    'empty': '',
    'not an object': '[10, 20]',
    'a step that is not a number': '{"steps": {"ten": {"sound": true}}, "diverged": null}',
    'an entry of another shape': '{"steps": {"20": {"sound": "yes"}}, "diverged": null}',
    'a divergence without its config': '{"steps": {}, "diverged": {"step": 3}}',
}


@pytest.mark.parametrize('ledger', list(LEDGERS))
def test_a_damaged_ledger_is_refused_naming_the_file_and_the_fix(tmp_path, ledger):
  path = pathlib.Path(run_folder.RunFolder(str(tmp_path)).ledger)
  path.write_text(LEDGERS[ledger])
  with pytest.raises(ConfigError) as refused:
    sound_steps.SoundStepLedger(str(tmp_path))
  message = str(refused.value)
  assert '\n' not in message
  assert message.startswith(f'{path} is damaged: '), message
  assert f'move it aside (e.g. to {path}.damaged) to count every kept checkpoint as sound' in (
      message
  )


def test_an_intact_ledger_and_none_read_as_before(run_copy, tmp_path):
  ledger = sound_steps.SoundStepLedger(run_copy)
  assert sorted(ledger.steps) == [10, 20] and ledger.is_sound(20) and ledger.diverged is None
  assert sound_steps.SoundStepLedger(str(tmp_path)).steps == {}


def test_training_on_a_damaged_ledger_is_refused_and_changes_nothing(run_copy):
  with open(run_folder.RunFolder(run_copy).ledger, 'w') as f:
    f.write('{"steps": {"10": ')
  before = folder_contents(run_copy)
  with pytest.raises(ConfigError, match=r'sound_steps.json is damaged: it is not JSON'):
    trainer.train_and_evaluate(tiny_config(total_steps=30), run_copy)
  assert folder_contents(run_copy) == before


@pytest.mark.slow
def test_train_on_a_damaged_ledger_is_one_line(run_copy, run_command):
  ledger = run_folder.RunFolder(run_copy).ledger
  with open(ledger, 'w') as f:
    f.write('{"steps": {')
  before = folder_contents(run_copy)
  refused = run_command('train', *tiny_flags(run_copy), '--config.total_steps=30')
  one_error_line(refused, f'{ledger} is damaged: it is not JSON', 'move it aside')
  assert folder_contents(run_copy) == before


# --- A step without an integrity manifest, cut short ----------------------


def _largest(pattern):
  return max(glob.glob(pattern, recursive=True), key=os.path.getsize)


def _truncate(path):
  os.truncate(path, os.path.getsize(path) // 2)


# Damage to step 20 once its integrity.json is gone (a step written before
# checkpoints were sealed), and how the warning names it.
UNSEALED_DAMAGE = {
    'truncated data file': (
        lambda step: _truncate(_largest(f'{step}/state/ocdbt.process_0/d/*')),
        r'state/ cannot be read \(\S+: OUT_OF_RANGE: .*\)',
    ),
    'missing data file': (
        lambda step: os.remove(_largest(f'{step}/state/ocdbt.process_0/d/*')),
        r'state/ cannot be read \(\S+: its data file is missing\)',
    ),
    'truncated array index': (
        lambda step: _truncate(_largest(f'{step}/state/d/*')),
        r'state/ cannot be read \(its index: OUT_OF_RANGE: .*\)',
    ),
    'truncated tree metadata': (
        lambda step: _truncate(f'{step}/state/_METADATA'),
        r'state/_METADATA: it is not JSON \(.*\)',
    ),
    'truncated config': (
        lambda step: _truncate(f'{step}/config/metadata'),
        r'config/metadata: it is not JSON \(.*\)',
    ),
}


@pytest.fixture(params=list(UNSEALED_DAMAGE))
def unsealed_damage(request, run_copy):
  """(workdir, pattern of the damage): the run copy whose step 20 has no
  manifest and the damage named by the parameter."""
  damage, words = UNSEALED_DAMAGE[request.param]
  step = os.path.join(run_folder.RunFolder(run_copy).checkpoints, '20')
  os.remove(os.path.join(step, step_files.MANIFEST_FILE))
  damage(step)
  return run_copy, f'it has no integrity.json, and {words}'


def test_readers_skip_an_unsealed_step_cut_short_with_one_warning(unsealed_damage, caplog):
  workdir, damage = unsealed_damage
  before = folder_contents(workdir)
  assert run_loading.load_run(tiny_config(), workdir).step == 10
  (warning,) = _warnings(caplog, 'damaged')
  assert re.fullmatch(
      rf'The checkpoint of step 20 in \S+ is damaged \({damage}\); skipped it: step 10, the '
      'newest intact one, is read instead.',
      warning,
  ), warning
  assert folder_contents(workdir) == before


def test_an_unsealed_step_cut_short_asked_for_is_refused(unsealed_damage):
  workdir, damage = unsealed_damage
  with pytest.raises(ConfigError) as refused:
    linformer_jax.load(workdir, step=20)
  assert re.fullmatch(
      rf'The checkpoint of step 20 in \S+ is damaged \({damage}\); use step 10, the newest '
      r'intact one, instead, or delete \S+ so that step 10 is the newest.',
      str(refused.value),
  ), refused.value


def test_training_moves_an_unsealed_step_cut_short_aside(unsealed_damage, caplog):
  workdir, damage = unsealed_damage
  with CheckpointStore(run_folder.RunFolder(workdir).checkpoints, owner=True) as store:
    assert store.latest_step() == 10 and store.all_steps() == [10]
  moved = os.path.join(run_folder.RunFolder(workdir).damaged_checkpoints, '20')
  (warning,) = _warnings(caplog, 'damaged')
  assert re.fullmatch(
      rf'The checkpoint of step 20 in \S+ is damaged \({damage}\); moved it to {moved}.', warning
  ), warning
  assert os.path.isdir(moved)


def test_an_intact_unsealed_step_is_still_read_unverified(run_copy, caplog):
  os.remove(
      os.path.join(run_folder.RunFolder(run_copy).checkpoints, '20', step_files.MANIFEST_FILE)
  )
  assert run_loading.load_run(tiny_config(), run_copy).step == 20
  assert _warnings(caplog, 'damaged') == []
  assert len(_warnings(caplog, 'it is read unverified')) == 1


@pytest.mark.slow
def test_evaluate_skips_an_unsealed_step_cut_short_in_one_line(run_copy, run_command):
  step = os.path.join(run_folder.RunFolder(run_copy).checkpoints, '20')
  os.remove(os.path.join(step, step_files.MANIFEST_FILE))
  _truncate(_largest(f'{step}/state/ocdbt.process_0/d/*'))
  result = run_command('evaluate', f'--workdir={run_copy}')
  assert result.returncode == 0, result.stderr
  assert '"step": 10,' in result.stdout
  (line,) = [line for line in result.stderr.splitlines() if line.strip()]
  assert 'The checkpoint of step 20' in line and 'skipped it: step 10' in line, line


# --- Files where the run's folders belong ---------------------------------


def _state(value):
  """A state whose array is too large for OCDBT to keep inline in its index."""
  return {'w': jax.random.normal(jax.random.PRNGKey(int(value)), (4096,), jnp.float32)}


def _abstract(state):
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
  )


def _save(store, step):
  store.save(step, state=_state(float(step)), data_state={'at': step}, config={'c': 1})


def test_a_file_where_the_checkpoints_belong_is_refused_before_orbax_meets_it(tmp_path):
  directory = tmp_path / 'run' / 'checkpoints'
  directory.parent.mkdir()
  directory.write_text('notes')
  for owner in (True, False):
    with pytest.raises(ConfigError) as refused:
      CheckpointStore(str(directory), owner=owner)
    assert str(refused.value) == (
        f'{directory} is a file, but the run keeps its checkpoints in a folder there; move the '
        'file aside or delete it, then run the same command again.'
    )
  assert directory.read_text() == 'notes'


def test_a_file_that_takes_the_checkpoints_place_during_a_run_stops_its_next_save(tmp_path):
  """Orbax would fail making the step's temporary folder in its own thread,
  which then never ends: the save is refused before orbax starts it."""
  directory = tmp_path / 'run' / 'checkpoints'
  with CheckpointStore(str(directory), owner=True) as store:
    _save(store, 1)
    store.wait()
    shutil.rmtree(directory)
    directory.write_text('notes')
    with pytest.raises(ConfigError, match='is a file, but the run keeps its checkpoints'):
      _save(store, 2)


@pytest.mark.slow
def test_train_with_a_file_for_its_checkpoints_is_one_line(tmp_path, run_command):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'checkpoints').write_text('')
  refused = run_command('train', *tiny_flags(workdir), timeout=120)
  one_error_line(refused, f'{workdir / "checkpoints"} is a file', 'move the file aside')


def test_a_file_named_as_an_unfinished_save_is_moved_aside_and_saving_goes_on(tmp_path, caplog):
  directory = tmp_path / 'run' / 'checkpoints'
  with CheckpointStore(str(directory), owner=True) as store:
    _save(store, 1)
  stray = directory / f'2{step_files.TMP_SUFFIX}'
  stray.write_text('not a save')
  with CheckpointStore(str(directory), owner=True) as store:
    _save(store, 2)
    store.wait()
    assert store.restore(abstract_state=_abstract(_state(0.0)))[0] == 2
  moved = pathlib.Path(run_folder.RunFolder(str(tmp_path / 'run')).damaged_checkpoints) / stray.name
  assert moved.read_text() == 'not a save'
  (warning,) = _warnings(caplog, 'name of an unfinished save')
  assert warning == (
      f'{stray} is not a folder, yet it has the name of an unfinished save; moved it to {moved}.'
  )


def test_a_file_where_damaged_steps_go_is_refused_in_one_line(tmp_path):
  directory = tmp_path / 'run' / 'checkpoints'
  with CheckpointStore(str(directory), owner=True) as store:
    _save(store, 1)
    _save(store, 2)
  os.remove(_largest(f'{directory}/2/state/**/d/*'))
  damaged = pathlib.Path(run_folder.RunFolder(str(tmp_path / 'run')).damaged_checkpoints)
  damaged.write_text('notes')
  with pytest.raises(ConfigError) as refused:
    CheckpointStore(str(directory), owner=True)
  assert str(refused.value) == (
      f'{damaged} is a file, but the run keeps the checkpoints it moves aside in a folder '
      'there; move the file aside or delete it, then run the same command again.'
  )
  assert sorted(os.listdir(directory)) == ['1', '2']


def test_a_protected_marker_made_as_a_folder_protects_and_is_removed_when_unprotected(tmp_path):
  directory = tmp_path / 'run' / 'checkpoints'
  with CheckpointStore(str(directory), owner=True) as store:
    _save(store, 1)
  (directory / '1' / step_files.PROTECTED_FILE).mkdir()
  assert step_files.protected_steps(str(directory)) == {1}
  step_files.mark_protected(str(directory), 1, True)  # already marked: kept as it is
  assert (directory / '1' / step_files.PROTECTED_FILE).is_dir()
  step_files.mark_protected(str(directory), 1, False)
  assert step_files.protected_steps(str(directory)) == set()


@pytest.mark.parametrize(
    'text, holder',
    [
        (json.dumps({'host': 'h', 'pid': 7, 'time': 1.0}), 'host h, pid 7'),
        ('garbage', "an unknown holder: .lock holds 'garbage'"),
        ('[1, 2]', "an unknown holder: .lock holds '[1, 2]'"),
        ('{"host": "h"}', 'an unknown holder: .lock holds \'{"host": "h"}\''),
    ],
    ids=['a run', 'not JSON', 'not an object', 'no pid'],
)
def test_a_gs_lock_object_another_program_wrote_names_an_unknown_holder(text, holder):
  assert workdir_lock._holder(text) == holder  # pylint: disable=protected-access


def test_an_unsealed_step_on_gs_is_read_through_and_one_cut_short_is_skipped(gcs_bucket, caplog):
  directory = f'{gcs_bucket}/runs/unsealed/checkpoints'
  with CheckpointStore(directory, owner=True) as store:
    _save(store, 1)
    _save(store, 2)
  for step in (1, 2):
    storage.remove(f'{directory}/{step}/{step_files.MANIFEST_FILE}')
  with CheckpointStore(directory) as store:
    assert store.latest_step() == 2
  data = f'{directory}/2/state/ocdbt.process_0/d'
  largest = max(storage.listdir(data), key=lambda name: storage.getsize(f'{data}/{name}'))
  with storage.open_file(f'{data}/{largest}', 'rb') as f:
    whole = f.read()
  with storage.open_file(f'{data}/{largest}', 'wb') as f:
    f.write(whole[: len(whole) // 2])
  with CheckpointStore(directory) as store:
    assert store.latest_step() == 1
  (warning,) = _warnings(caplog, 'damaged')
  assert 'step 2' in warning and 'it has no integrity.json, and state/ cannot be read' in warning


# --- The tokenizer file, metrics.jsonl and eval_results.json -----------------


@pytest.mark.parametrize('kind', ['sentencepiece', 'huggingface'])
def test_a_tokenizer_file_that_is_no_tokenizer_is_one_line_naming_it(tmp_path, kind):
  path = tmp_path / 'tokenizer.model'
  path.write_bytes(b'\x00garbage, not a tokenizer')
  with pytest.raises(ConfigError) as refused:
    tokenizer_files._load_checked(kind, path, 8000, 'use a new workdir')  # pylint: disable=protected-access
  message = str(refused.value)
  assert '\n' not in message
  assert message.startswith(f'{path} cannot be read as a {kind} tokenizer (')
  assert message.endswith(
      "it is the run's own tokenizer: put back an intact copy of it, or use a new workdir."
  )


def test_a_tokenizer_of_another_vocabulary_says_it_may_have_been_changed(tmp_path):
  path = REPO_ROOT / 'tests' / 'fixtures' / 'hf' / 'roberta' / 'tokenizer.json'
  with pytest.raises(ConfigError, match='the file was changed or cut short since'):
    tokenizer_files._load_checked('huggingface', path, 8, 'use a new workdir')  # pylint: disable=protected-access


def test_damaged_metrics_lines_are_skipped_with_one_warning_and_a_resume_keeps_the_rest(
    run_copy, caplog
):
  path = run_folder.RunFolder(run_copy).metrics
  lines = open(path).read().splitlines()
  damaged = lines[:2] + ['{"step": 3, "train_lo', 'not json', '[1, 2]'] + lines[2:]
  with open(path, 'w') as f:
    f.write('\n'.join(damaged) + '\n')
  records = metric_writers.read_metrics(run_copy)
  assert len(records) == len(lines)
  assert len(_warnings(caplog, 'that are no metrics record (line 3, 4, 5)')) == 1
  logger = metric_writers.MetricLogger(run_copy, total_steps=20, is_primary=True)
  logger.discard_after(10)  # as a resume from step 10 does
  logger.close()
  kept = metric_writers.read_metrics(run_copy)
  assert kept and all(record['step'] <= 10 for record in kept)
  assert [r for r in records if r['step'] <= 10] == kept


def test_a_damaged_eval_results_file_is_evaluated_again(tmp_path, caplog):
  results = pathlib.Path(run_folder.RunFolder(str(tmp_path)).results)
  results.write_text('{"step": 20, "eval_lo')
  assert sweep_report.results_of(str(tmp_path)) is None
  assert len(_warnings(caplog, 'is damaged (no JSON object): evaluating the variant again')) == 1
  results.write_text('{"step": 20, "eval_loss": null}')
  assert sweep_report.results_of(str(tmp_path)) == {'step': 20, 'eval_loss': None}
