"""gs:// workdirs and data, against a GCS emulator on the loopback address.

The `gcs_bucket` fixture (tests/gcs_emulator.py) runs fake-gcs-server with
one bucket and points TensorStore, gcsfs and google-cloud-storage at it, so a
run writes to gs:// exactly as on Google Cloud, through the same clients.
"""

import json

import jax
import numpy as np
import pytest
from run_helpers import final_params
from run_helpers import losses_by_step
from run_helpers import tiny_config

from linformer_jax import run_folder
from linformer_jax import storage
from linformer_jax.checkpoints.store import CheckpointStore
from linformer_jax.data import remote_splits
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.training import hf_import
from linformer_jax.training import run_config
from linformer_jax.training import trainer
from linformer_jax.training import workdir_lock


@pytest.mark.parametrize(
    'workdir, words',
    [
        ('s3://bucket/run', 's3:// is not a supported storage'),
        ('http://host/run', 'http:// is not a supported storage'),
        ('gs:///run', 'names no bucket'),
        ('', 'cannot be a run folder'),
    ],
)
def test_an_unsupported_workdir_url_is_refused_in_one_line(workdir, words):
  with pytest.raises(ConfigError, match=words) as error:
    storage.location(workdir)
  assert '\n' not in str(error.value)


def test_local_paths_are_made_absolute_and_gs_urls_kept(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert storage.location('runs/a') == str(tmp_path / 'runs' / 'a')
  assert storage.location('gs://b/runs/a/') == 'gs://b/runs/a'


def test_the_cli_refuses_an_unsupported_scheme_before_writing(run_command):
  result = run_command('train', '--config=configs/tiny.py', '--workdir=s3://bucket/run')
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert errors == [
      "error: --workdir='s3://bucket/run': s3:// is not a supported storage; use a local path "
      'or gs://BUCKET/PATH.'
  ]


def test_the_path_layer_on_gs(gcs_bucket):
  folder = f'{gcs_bucket}/paths'
  storage.makedirs(folder)
  storage.write_text(f'{folder}/a/b.json', '{"x": 1}')
  storage.write_text(f'{folder}/a/c/d.txt', 'd')
  assert storage.isdir(f'{folder}/a') and storage.isfile(f'{folder}/a/b.json')
  assert sorted(storage.listdir(f'{folder}/a')) == ['b.json', 'c']
  assert list(storage.files_under(f'{folder}/a')) == ['b.json', 'c/d.txt']
  assert storage.getsize(f'{folder}/a/b.json') == 8
  storage.move(f'{folder}/a', f'{folder}/moved')
  assert not storage.exists(f'{folder}/a')
  assert json.loads(storage.read_text(f'{folder}/moved/b.json')) == {'x': 1}


@pytest.mark.long
@pytest.mark.slow
def test_a_run_on_buckets_alone_resumes_on_another_host_as_a_local_run(
    gcs_bucket, tmp_path, monkeypatch
):
  """A run whose workdir and prepared data are in the bucket, stopped at step
  4 and resumed on "another host" (an empty data cache), takes bitwise the
  losses and parameters of a local run never stopped.

  The first leg prepares the splits in its local mirror and uploads them, and
  trains its SentencePiece tokenizer in a local mirror of the workdir and
  uploads it; the second downloads both instead of preparing or training.
  """
  config = tiny_config(total_steps=8, log_every=1, eval_every=4, checkpoint_every=4)
  config.data.tokenizer, config.data.vocab_size = 'sentencepiece', 200
  config.data.tokenizer_sample_chars = 100_000
  local, remote = str(tmp_path / 'local'), f'{gcs_bucket}/runs/tiny'
  config.data.cache_dir = str(tmp_path / 'cache_local')
  expected = trainer.train_and_evaluate(config, local)

  config.data.prepared_dir = f'{gcs_bucket}/prepared'
  config.data.cache_dir = str(tmp_path / 'cache_first_host')
  assert trainer.train_and_evaluate(config, remote, stop_after=4) is None
  uploaded = storage.listdir(f'{gcs_bucket}/prepared/{config.data.train_split}')
  assert 'part-0-of-1.json' in uploaded and any(n.endswith('.array_record') for n in uploaded)
  assert storage.exists(f'{remote}/tokenizer.model')

  config.data.cache_dir = str(tmp_path / 'cache_second_host')
  downloaded = []
  download = remote_splits.download
  monkeypatch.setattr(
      remote_splits, 'download', lambda *args: downloaded.append(download(*args)) or downloaded[-1]
  )

  def never(*args, **kwargs):
    raise AssertionError('the tokenizer was trained again')

  monkeypatch.setattr(tokenizer_lib.SentencePieceTokenizer, 'train', never)
  results = trainer.train_and_evaluate(config, remote)
  assert downloaded[0] == len([name for name in uploaded if name.endswith('.array_record')])

  assert losses_by_step(remote) == losses_by_step(local)
  assert results['eval_loss'] == expected['eval_loss']
  step_a, params_a = final_params(local, config)
  step_b, params_b = final_params(remote, config)
  assert step_a == step_b == 8
  jax.tree_util.tree_map(np.testing.assert_array_equal, params_a, params_b)
  with CheckpointStore(run_folder.RunFolder(remote).checkpoints) as store:
    assert store.all_steps() == [4, 8]
  names = set(storage.listdir(remote))
  assert {'checkpoints', 'config.json', 'eval_results.json', 'metrics.jsonl'} <= names
  assert any(name.startswith('events.out.tfevents') for name in names)
  assert run_folder.LOCK_OBJECT not in names  # released at the end


def test_a_held_gs_lock_refuses_a_second_run_and_a_stale_one_is_taken_over(gcs_bucket, monkeypatch):
  workdir = f'{gcs_bucket}/runs/locked'
  with workdir_lock.exclusive_workdir(workdir):
    with pytest.raises(ConfigError, match='is in use by another run') as error:
      with workdir_lock.exclusive_workdir(workdir):
        pass
    assert '\n' not in str(error.value)
  # A run that died keeps its lock object; once not renewed for the lease,
  # the next run takes it over.
  storage.write_text(run_folder.RunFolder(workdir).lock_object, '{"host": "gone", "pid": 1}')
  monkeypatch.setattr(workdir_lock, 'LEASE_SECONDS', 0.0)
  with workdir_lock.exclusive_workdir(workdir):
    assert storage.exists(run_folder.RunFolder(workdir).lock_object)
  assert not storage.exists(run_folder.RunFolder(workdir).lock_object)


def test_commands_that_stage_files_locally_refuse_a_gs_workdir(run_command):
  with pytest.raises(ConfigError, match='an import is written to a local folder'):
    hf_import._check_workdir('gs://bucket/imported')  # pylint: disable=protected-access
  result = run_command(
      'sweep', '--sweep=configs/sweeps/projected_len.py', '--workdir=gs://bucket/sweep'
  )
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'a sweep writes its report and figure to a local' in errors[0]


def test_gs_paths_pass_the_path_checks_where_the_store_answers(gcs_bucket):
  """Every field that may be on gs:// passes `storage.check_paths` against the
  emulator; the data cache, a folder on this machine, is refused still."""
  config = tiny_config(init_from=f'{gcs_bucket}/runs/pretrained')
  config.compilation_cache_dir = f'{gcs_bucket}/compiled'
  config.data.prepared_dir = f'{gcs_bucket}/prepared'
  config.data.tfds_data_dir = f'{gcs_bucket}/tfds'
  paths = run_config.expand_paths(config) + [('--workdir', f'{gcs_bucket}/runs/new')]
  storage.check_paths(paths, run_config.LOCAL_PATHS)
  config.data.cache_dir = f'{gcs_bucket}/cache'
  with pytest.raises(ConfigError, match=r"^config.data.cache_dir='gs://.*' names an object store"):
    storage.check_paths(run_config.expand_paths(config), run_config.LOCAL_PATHS)
