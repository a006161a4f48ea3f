"""Sweeps: a real two-variant run of tiny configs, resume, --set, errors, the CLI.

The sweep runs in-process; the `slow` tests run `python -m linformer_jax.sweep`.

  python -m pytest -q tests/test_sweep.py
"""

import hashlib
import json
import math
import os
import pathlib
import shlex

import pytest
from run_helpers import tiny_config

from linformer_jax import run_folder
from linformer_jax import sweep as sweep_lib
from linformer_jax.analysis import sweep_report
from linformer_jax.errors import ConfigError
from linformer_jax.training import divergence
from linformer_jax.training import run_config
from linformer_jax.training import trainer

TINY_SWEEP = '''"""Transformer against Linformer k=4 on configs/tiny.py, for tests."""

from configs import tiny
from linformer_jax.sweep import Sweep
from linformer_jax.sweep import Variant


def get_sweep():
  base = tiny.get_config()
  base.total_steps = 3  # a few steps: the loop, not the model, is under test
  base.warmup_steps = 1  # at most total_steps
  base.model.num_layers = 1  # less to compile
  return Sweep(title='tiny sweep', base=base, variants=[
      Variant('transformer', {'model.attention': 'full'}),  # standard attention
      Variant('k4', {'model.projected_len': 4}),  # Linformer, k = n/8
  ])
'''


def write_sweep_file(directory, text=TINY_SWEEP):
  path = os.path.join(str(directory), 'tiny_sweep.py')
  with open(path, 'w') as f:
    f.write(text)
  return path


@pytest.fixture(scope='module')
def tiny_sweep(tmp_path_factory):
  return sweep_lib.load_sweep(write_sweep_file(tmp_path_factory.mktemp('sweep')))


@pytest.fixture(scope='module')
def finished_sweep(tmp_path_factory, tiny_sweep):
  workdir = str(tmp_path_factory.mktemp('workdir'))
  results = sweep_lib.run_sweep(tiny_sweep, workdir)
  return workdir, results


def saved_config(workdir):
  with open(os.path.join(workdir, 'config.json')) as f:
    return json.load(f)


def table_rows(workdir):
  with open(os.path.join(workdir, sweep_lib.REPORT_FILE)) as f:
    text = f.read()
  # The first table: one row per variant (the ones after it are by step and by seed).
  first = text[text.index('| variant') :].split('\n\n', 1)[0]
  lines = [line for line in first.splitlines() if line.startswith('| ')]
  header, rows = lines[0], lines[1:]
  columns = [cell.strip() for cell in header.strip('|').split('|')]
  return {
      cells[0]: dict(zip(columns, cells))
      for cells in ([cell.strip() for cell in row.strip('|').split('|')] for row in rows)
  }


def test_every_variant_trains_with_its_overrides(finished_sweep):
  workdir, results = finished_sweep
  assert list(results) == ['transformer', 'k4']
  transformer = saved_config(os.path.join(workdir, 'transformer'))
  linformer = saved_config(os.path.join(workdir, 'k4'))
  assert transformer['model']['attention'] == 'full'
  assert (linformer['model']['attention'], linformer['model']['projected_len']) == ('linformer', 4)
  for name in results:
    with open(run_folder.RunFolder(os.path.join(workdir, name)).results) as f:
      assert json.load(f)['step'] == 3


def test_report_has_a_row_per_variant_and_a_figure(finished_sweep):
  workdir, results = finished_sweep
  rows = table_rows(workdir)
  assert list(rows) == ['transformer', 'k4']
  for name, row in rows.items():
    perplexity = float(row['validation perplexity'].replace(',', ''))
    assert math.isfinite(perplexity) and perplexity > 1
    assert perplexity == pytest.approx(results[name]['eval_perplexity'], rel=1e-3)
    assert math.isfinite(float(row['unigram perplexity'].replace(',', '')))
    assert int(row['parameters'].replace(',', '')) == results[name]['parameters']
  assert "model.attention='full'" in rows['transformer']['overrides']
  assert 'model.projected_len=4' in rows['k4']['overrides']
  with open(os.path.join(workdir, sweep_report.FIGURE_FILE), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def variant_files(workdir, names):
  """Each file under the variants' directories -> (modification time, SHA-256)."""
  files = {}
  for name in names:
    for root, _, filenames in os.walk(os.path.join(workdir, name)):
      for filename in filenames:
        path = os.path.join(root, filename)
        with open(path, 'rb') as f:
          files[path] = (os.path.getmtime(path), hashlib.sha256(f.read()).hexdigest())
  return files


def test_a_rerun_skips_finished_variants(finished_sweep, tiny_sweep, monkeypatch, capsys):
  workdir, results = finished_sweep
  before = variant_files(workdir, results)
  assert any(path.endswith(run_folder.RESULTS) for path in before)

  def must_not_train(*args, **kwargs):
    raise AssertionError(f'a finished variant was trained again: {args}, {kwargs}')

  monkeypatch.setattr(trainer, 'train_and_evaluate', must_not_train)
  capsys.readouterr()
  again = sweep_lib.run_sweep(tiny_sweep, workdir)
  printed = capsys.readouterr().out
  assert 'Variant transformer (1/2) finished its 3 steps before; skipping it.' in printed
  assert 'Variant k4 (2/2) finished its 3 steps before; skipping it.' in printed
  # Nothing of the finished runs was touched: results, metrics, checkpoints.
  assert variant_files(workdir, results) == before
  assert again == results
  assert list(table_rows(workdir)) == ['transformer', 'k4']


def test_sets_apply_to_every_variant_with_the_base_field_types(tiny_sweep):
  configs = sweep_lib.variant_configs(
      tiny_sweep,
      [
          'total_steps=7',
          'learning_rate=1e-3',
          'model.pre_layer_norm=true',
          'mesh_shape=(1, 1)',
          'data.eval_split=test',
          'model.projected_len=2',
      ],
  )
  assert list(configs) == ['transformer', 'k4']
  for config in configs.values():
    assert config.total_steps == 7 and isinstance(config.total_steps, int)
    assert config.learning_rate == 1e-3
    assert config.model.pre_layer_norm is True
    assert config.mesh_shape == (1, 1)
    assert config.data.eval_split == 'test'
    # A --set comes after the variant's own overrides.
    assert config.model.projected_len == 2
  assert configs['transformer'].model.attention == 'full'
  per_layer = sweep_lib.variant_configs(
      tiny_sweep, ['model.sharing=none', 'model.projected_len=(4,)']
  )
  assert per_layer['k4'].model.projected_len == (4,)
  assert tiny_sweep.base.total_steps == 3, 'the base config must stay unchanged'


@pytest.mark.parametrize(
    'sets, named',
    [
        (['model.projected_lenn=4'], 'model.projected_lenn'),
        (['modle.attention=full'], 'modle.attention'),
        (['total_steps=many'], 'total_steps'),
        (['learning_rate=fast'], 'learning_rate'),
        (['model.pre_layer_norm=maybe'], 'model.pre_layer_norm'),
        (['model=full'], 'model'),
        (['total_steps'], 'total_steps'),
        (['model.projected_len=64'], 'projected_len'),
    ],
)
def test_bad_sets_name_the_key_before_anything_runs(tiny_sweep, tmp_path, sets, named):
  workdir = tmp_path / 'never_created'
  with pytest.raises(ConfigError, match=named.replace('.', r'\.')):
    sweep_lib.run_sweep(tiny_sweep, str(workdir), sets=sets)
  assert not workdir.exists()


def test_bad_variants_and_names_are_errors(tiny_sweep):
  bad_key = sweep_lib.Sweep(
      base=tiny_sweep.base, variants=[sweep_lib.Variant('typo', {'model.atention': 'full'})]
  )
  with pytest.raises(ConfigError, match=r"'typo'.*model\.atention"):
    sweep_lib.variant_configs(bad_key)
  bad_value = sweep_lib.Sweep(
      base=tiny_sweep.base, variants=[sweep_lib.Variant('big', {'model.projected_len': 'big'})]
  )
  with pytest.raises(ConfigError, match=r"'big'.*model\.projected_len"):
    sweep_lib.variant_configs(bad_value)
  with pytest.raises(ConfigError, match='no variant named k99'):
    sweep_lib.run_sweep(tiny_sweep, '/nonexistent/never', only=['k99'])


def test_a_sweep_file_with_two_variants_of_one_name_is_refused(tmp_path):
  text = TINY_SWEEP.replace("Variant('k4'", "Variant('transformer'")
  with pytest.raises(ConfigError, match="two variants are named 'transformer'"):
    sweep_lib.load_sweep(write_sweep_file(tmp_path, text))


def test_every_sweep_file_loads_and_its_variants_validate(repo_root):
  sweeps = repo_root / 'configs' / 'sweeps'
  paths = sorted(str(path) for path in sweeps.glob('[!_]*.py'))
  names = {os.path.basename(path)[:-3] for path in paths}
  assert {'projected_len', 'sharing', 'projection', 'seq_len', 'gutenberg'} <= names
  for path in paths:
    sweep = sweep_lib.load_sweep(path)
    configs = sweep_lib.variant_configs(sweep)
    assert list(configs) == [variant.name for variant in sweep.variants]
    for config in configs.values():
      run_config.RunConfig.from_config(config)
  seq_len = sweep_lib.variant_configs(sweep_lib.load_sweep(str(sweeps / 'seq_len.py')))
  assert {c.batch_size * c.model.max_len for c in seq_len.values()} == {4096}
  assert {c.model.projected_len for c in seq_len.values()} == {32}


@pytest.mark.slow
def test_cli_reports_a_finished_sweep(finished_sweep, tmp_path, run_command):
  workdir, _ = finished_sweep
  process = run_command(
      'sweep',
      f'--sweep={write_sweep_file(tmp_path)}',
      f'--workdir={workdir}',
      '--only=k4',
      '--set=total_steps=3',
  )
  assert process.returncode == 0, process.stderr
  assert 'k4 (1/1) finished its 3 steps before; skipping it' in process.stdout
  assert '| transformer |' in process.stdout and '| k4 |' in process.stdout
  assert list(table_rows(workdir)) == ['transformer', 'k4']


@pytest.mark.slow
def test_cli_bad_key_is_a_one_line_error(tmp_path, run_command):
  sweep_file = write_sweep_file(tmp_path)
  workdir = tmp_path / 'cli_error'
  process = run_command(
      'sweep', f'--sweep={sweep_file}', f'--workdir={workdir}', '--set=model.projected_lenn=4'
  )
  assert process.returncode == 2
  lines = process.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ')
  assert 'model.projected_lenn' in lines[0]
  assert not workdir.exists()


def test_a_diverged_variant_is_advised_in_the_sweep_s_own_flags(tiny_sweep):
  """--only=NAME and --set=KEY=VALUE, which the sweep takes (not train's
  --config.X); a --set of the learning rate goes back to the sweep file's."""
  error = divergence.NonFiniteLossError('Diverged.', learning_rate=1e12, restore_step=1)
  diverged = sweep_lib.VariantDivergedError('k4', '/w/k4', error, own_learning_rate=2e-3)
  assert diverged.flags == ['--only=k4', '--set=restore_step=1']
  argv = ['--sweep=s.py', '--workdir=/w', '--only=k4,transformer', '--set=total_steps=8']
  command = divergence.command_to_go_on(
      [*argv, '--set', 'learning_rate=1e12'],
      diverged.flags,
      dropped=diverged.dropped,
      program='linformer_jax.sweep',
      keyed=['--set'],
  )
  assert command == (
      'python -m linformer_jax.sweep --sweep=s.py --workdir=/w --set=total_steps=8 --only=k4 '
      '--set=restore_step=1'
  )
  assert str(diverged) == (
      "sweep variant 'k4': Diverged. Go on with the sweep file's own learning rate, 0.002 (the "
      "override 1e+12 diverged): the sweep's command with --only=k4 --set=restore_step=1"
  )
  # No sound step kept: the variant's folder is set aside; the rate is the sweep's own form.
  error = divergence.DivergenceError('Diverged.', learning_rate=100.0, restart_workdir='/w/k4-x')
  diverged = sweep_lib.VariantDivergedError('k4', '/w/k4', error, own_learning_rate=None)
  assert diverged.flags == ['--only=k4', '--set=learning_rate=0.001'] and not diverged.dropped
  assert str(diverged).endswith(
      "move /w/k4 aside, then run the sweep's command with --only=k4 --set=learning_rate=0.001"
  )
  assert sweep_lib.parse_sets(tiny_sweep.base, ['restore_step=1', 'learning_rate=0.001']) == {
      'restore_step': 1,
      'learning_rate': 0.001,
  }


# About 16 s: in make test-all; the line itself is checked by
# test_a_diverged_variant_is_advised_in_the_sweep_s_own_flags.
@pytest.mark.long
def test_a_diverged_variant_s_command_goes_on_with_it(tmp_path, run_command):
  """learning_rate=1e12 by --set: the variant diverges keeping step 1; the
  sweep command its error line gives is accepted and trains the variant
  from step 1 to a healthy end."""
  workdir = tmp_path / 'diverging'
  process = run_command(
      'sweep',
      f'--sweep={write_sweep_file(tmp_path)}',
      f'--workdir={workdir}',
      '--only=k4',
      '--set=checkpoint_every=1',
      '--set=log_every=1',
      '--set=total_steps=8',
      '--set=learning_rate=1e12',
  )
  assert process.returncode == 2, process.stderr
  (line,) = [line for line in process.stderr.splitlines() if line.startswith('error:')]
  assert "sweep variant 'k4': Training diverged" in line and 'step 1 is from before' in line
  command = shlex.split(line.split(': python -m linformer_jax.sweep ', 1)[1])
  assert command[-2:] == ['--only=k4', '--set=restore_step=1'], line
  assert not any(flag.startswith(('--config.', '--set=learning_rate')) for flag in command)
  went_on = run_command('sweep', *command)
  assert went_on.returncode == 0, went_on.stderr
  with open(run_folder.RunFolder(str(workdir / 'k4')).results) as f:
    results = json.load(f)
  assert results['step'] == 8 and results['eval_loss'] < math.log(260)  # a uniform guess
  assert sorted(os.listdir(workdir / 'k4' / 'diverged_checkpoints' / 'from_1')) == ['4', '5']


def test_a_classification_sweep_reports_accuracy_and_the_spread_over_seeds(tmp_path):
  """Written from finished runs' files alone: the table, the seed groups
  (mean and sample standard deviation) and accuracy.png."""
  base = sweep_lib.load_sweep(write_sweep_file(tmp_path)).base
  base.task = 'classification'
  accuracies = {'mean-s0': 0.70, 'mean-s1': 0.74, 'first-s0': 0.55, 'first-s1': 0.61}
  variants = [
      sweep_lib.Variant(name, {'model.pooling': name.split('-')[0], 'seed': int(name[-1])})
      for name in accuracies
  ]
  sweep = sweep_lib.Sweep(base=base, variants=variants, title='pooling')
  for name, accuracy in accuracies.items():
    folder = tmp_path / name
    folder.mkdir()
    results = {
        'step': 10,
        'eval_split': 'validation',
        'eval_accuracy': accuracy,
        'eval_loss': 0.6,
        'majority_class_accuracy': 0.5,
        'parameters': 1000,
        'wall_time_s': 5.0,
    }
    pathlib.Path(run_folder.RunFolder(str(folder)).results).write_text(json.dumps(results))
    lines = [{'step': step, 'eval_accuracy': accuracy * step / 10} for step in (5, 10)]
    (folder / 'metrics.jsonl').write_text(''.join(json.dumps(line) + '\n' for line in lines))
  sweep_lib.write_report(sweep, str(tmp_path))
  rows = table_rows(str(tmp_path))
  assert rows['mean-s1']['validation accuracy'] == '0.7400'
  assert rows['first-s0']['majority-class accuracy'] == '0.5000'
  text = (tmp_path / sweep_lib.REPORT_FILE).read_text()
  assert "| model.pooling='mean' | 2 of 2 | 0.7200 ± 0.0283 | 0.7000 | 0.7400 |" in text
  assert "| model.pooling='first' | 2 of 2 | 0.5800 ± 0.0424 | 0.5500 | 0.6100 |" in text
  for figure in ('accuracy.png', 'accuracy_over_seeds.png'):
    with open(tmp_path / figure, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert 'accuracy_over_seeds.png' in text


def test_the_by_step_table_gives_each_evaluation_and_when_a_run_left_the_plateau(tmp_path):
  """A run leaves the unigram plateau at its first evaluation at or below
  0.85 x the unigram perplexity (700 here: 595 or less)."""
  curves = {'stuck': [710.0, 700.0, 698.0], 'leaves': [720.0, 600.0, 595.0]}
  for name, values in curves.items():
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / 'metrics.jsonl', 'w') as f:
      for step, value in zip((100, 200, 300), values):
        f.write(json.dumps({'step': step, 'eval_perplexity': value}) + '\n')
    with open(tmp_path / name / 'eval_results.json', 'w') as f:
      json.dump({'step': 300, 'eval_perplexity': values[-1], 'unigram_perplexity': 700.0}, f)
  sweep = sweep_lib.Sweep(base=tiny_config(), variants=[sweep_lib.Variant(name) for name in curves])
  table = sweep_report.steps_table(sweep, str(tmp_path)).splitlines()
  assert table[0] == '| variant | left the plateau at step | 100 | 200 | 300 |'
  assert table[2] == '| stuck | – | 710.0 | 700.0 | 698.0 |'
  assert table[3] == '| leaves | 300 | 720.0 | 600.0 | 595.0 |'
