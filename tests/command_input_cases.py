"""The table of bad inputs that tests/test_command_inputs.py runs through
every command: what each case passes and what its one error line must say.

An argument may name the case's own folders, made for it by the test:
{run} and {causal} (copies of a finished tiny masked-LM and causal-LM run),
{file} (a file), {missing} (nothing there), {read_only} (a read-only copy of
the run), {read_only_folder} (an empty read-only folder), {not_utf8} (an
empty folder whose name is not valid UTF-8, written {not_utf8_shown} in an
error line), {home} (the case's folder, its $HOME in AT_HOME: ~/a_file is
{file}); and {refused_port}, a local port where nothing listens. `says` may
name them too. docs/reliability.md ("Every command's inputs") lists the table with the
line each case returns.
"""

import dataclasses
import pathlib
from typing import Dict, Tuple

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
HF_FOLDER = REPO_ROOT / 'tests' / 'fixtures' / 'hf' / 'roberta'
# The variables that point the Google clients at the tests' GCS emulator
# (tests/gcs_emulator.py): never passed to a case, which names its own.
EMULATOR_VARIABLES = (
    'TENSORSTORE_GCS_HTTP_URL',
    'GOOGLE_AUTH_TOKEN_FOR_TESTING',
    'STORAGE_EMULATOR_HOST',
    'FSSPEC_GS_TOKEN',
    'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT',
)
# Credentials that cannot be found, so that no case ever uses the user's own.
NO_CREDENTIALS = {'GOOGLE_APPLICATION_CREDENTIALS': '/nonexistent/credentials.json'}
# An object store without network: an emulator address where nothing listens.
NO_NETWORK = {'STORAGE_EMULATOR_HOST': 'http://127.0.0.1:{refused_port}'}

CAUSAL_FIELDS = {
    'task': 'causal_lm',
    'model.causal': True,
    'model.pre_layer_norm': True,
    'model.block_len': 8,
    'model.projected_len': 2,
}
TINY = ('--config=configs/tiny.py',)
EVALUATE = TINY + ('--workdir={run}',)
# The tiny causal run, 4 new tokens (of max_len=32): each case adds its own flag.
GENERATE = (
    TINY
    + tuple(f'--config.{key}={value}' for key, value in CAUSAL_FIELDS.items())
    + ('--workdir={causal}', '--max_new_tokens=4')
)
SPECTRUM = TINY + ('--workdir={run}', '--num_sequences=4')
SWEEP = (
    '--sweep=configs/sweeps/projected_len.py',
    '--set=total_steps=2',
    '--set=warmup_steps=1',
)
IMPORT = (
    '--config=configs/imported.py',
    '--config.model.max_len=64',
    '--config.model.projected_len=16',
    f'--from={HF_FOLDER}',
)
GS_WORKDIR = '--workdir=gs://linformer-test/run'
# The case's folder as $HOME: `~/NAME` is its {NAME} placeholder's path.
AT_HOME = {'HOME': '{home}'}
# A tiny training run, refused before it trains: each case adds its own flag.
TRAIN = TINY + ('--workdir={missing}',)
# What check_paths says of a name that is not valid UTF-8, after the setting.
NOT_UTF8 = "='{not_utf8_shown}' is not a valid UTF-8 name"


@dataclasses.dataclass(frozen=True)
class Case:
  """A bad input: `python -m linformer_jax.COMMAND ARGS` and what its error
  line says. `printed`: what stdout must hold too (results printed before a
  save that failed)."""

  command: str
  args: Tuple[str, ...]
  says: str
  env: Tuple[Tuple[str, str], ...] = ()
  printed: str = ''

  def needs_private_mounts(self) -> bool:
    return '{read_only' in ' '.join(self.args)


def case(command, args, says, env=None, printed=''):
  return Case(command, tuple(args), says, tuple((env or {}).items()), printed)


CASES: Dict[str, Case] = {
    # evaluate
    'evaluate/restore_step not kept': case(
        'evaluate',
        EVALUATE + ('--config.restore_step=7',),
        'config.restore_step=7: {run} keeps no checkpoint of step 7; its kept steps are 10, 20',
    ),
    'evaluate/cudnn kernel on a CPU': case(
        'evaluate',
        EVALUATE + ('--config.model.attention_kernel=cudnn',),
        "model.attention_kernel='cudnn' runs on NVIDIA GPUs, and this step is compiled for cpu; "
        "use 'auto' or 'einsum'.",
    ),
    'evaluate/restore_step negative': case(
        'evaluate',
        EVALUATE + ('--config.restore_step=-1',),
        'config.restore_step=-1 is not allowed: use an integer >= 0',
    ),
    'evaluate/read-only workdir': case(
        'evaluate',
        TINY + ('--workdir={read_only}',),
        'the results printed above are not saved: {read_only}/eval_validation.json cannot be '
        'written (Read-only file system)',
        printed='"step": 20',
    ),
    'evaluate/missing workdir': case(
        'evaluate', TINY + ('--workdir={missing}',), '{missing} holds no checkpoint'
    ),
    'evaluate/workdir is a file': case(
        'evaluate', TINY + ('--workdir={file}',), '{file} holds no checkpoint'
    ),
    'evaluate/empty workdir': case('evaluate', TINY + ('--workdir=',), 'cannot be a run folder'),
    'evaluate/no config, a workdir without a run': case(
        'evaluate',
        ('--workdir={missing}',),
        'no --config was given, and {missing}/config.json does not exist',
    ),
    'evaluate/no config, an empty workdir': case(
        'evaluate', ('--workdir=',), "--workdir='' names no run folder, and no --config was given"
    ),
    'evaluate/no config, a field of the model changed': case(
        'evaluate',
        ('--workdir={run}', '--config.model.num_layers=3'),
        'holds a run with config.model.num_layers=2, not 3',
    ),
    'spectrum/no config, a workdir that is a file': case(
        'spectrum', ('--workdir={file}',), 'no --config was given, and {file}/config.json'
    ),
    'evaluate/typo in a key': case(
        'evaluate',
        EVALUATE + ('--config.restor_step=3',),
        "--config.restor_step=3: config has no field 'restor_step'; did you mean "
        'config.restore_step?',
    ),
    # One k per layer, as docs/training.md writes it, reaches the model's checks.
    'evaluate/k per layer with one shared E': case(
        'evaluate',
        EVALUATE + ('--config.model.projected_len=(8,6)',),
        "config.model.projected_len=(8, 6) is not allowed: sharing='layerwise' needs one k",
    ),
    'evaluate/typo in a nested key': case(
        'evaluate',
        EVALUATE + ('--config.model.projected_lenn=3',),
        "config.model has no field 'projected_lenn'; did you mean config.model.projected_len?",
    ),
    'evaluate/unknown group': case(
        'evaluate', EVALUATE + ('--config.nope.x=1',), "config has no field 'nope'"
    ),
    'evaluate/unknown flag': case(
        'evaluate', EVALUATE + ('--nosuchflag',), '--nosuchflag is not a flag of this command'
    ),
    'evaluate/typo in a flag': case(
        'evaluate',
        EVALUATE + ('--splt=test',),
        '--splt is not a flag of this command; did you mean --split?',
    ),
    'evaluate/value of the wrong type': case(
        'evaluate',
        EVALUATE + ('--config.learning_rate=abc',),
        "--config.learning_rate=abc: could not convert string to float: 'abc'",
    ),
    'evaluate/unexpected argument': case(
        'evaluate', EVALUATE + ('extra',), "unexpected arguments ['extra']"
    ),
    'evaluate/no --workdir': case(
        'evaluate', ('--split=validation',), 'Flag --workdir must have a value other than None'
    ),
    'evaluate/missing flag file': case(
        'evaluate',
        EVALUATE + ('--flagfile={missing}',),
        '--flagfile={missing} cannot be opened (No such file or directory)',
    ),
    'evaluate/unknown split': case(
        'evaluate', EVALUATE + ('--split=bogus',), "Split 'bogus' does not exist"
    ),
    'evaluate/another model': case(
        'evaluate',
        EVALUATE + ('--config.model.hidden_dim=64',),
        '{run} holds a run with config.model.hidden_dim=32, not 64',
    ),
    'evaluate/unsupported storage': case(
        'evaluate', TINY + ('--workdir=s3://bucket/run',), 's3:// is not a supported storage'
    ),
    'evaluate/gs without credentials': case(
        'evaluate', TINY + (GS_WORKDIR,), 'no Google Cloud credentials (File '
    ),
    'evaluate/gs without network': case(
        'evaluate', TINY + (GS_WORKDIR,), 'cannot be reached (Connection refused)', NO_NETWORK
    ),
    # generate: sampling settings, steps, workdirs
    'generate/max_new_tokens negative': case(
        'generate',
        GENERATE + ('--max_new_tokens=-1',),
        '--max_new_tokens=-1 is not allowed: generate at least 1 token',
    ),
    'generate/max_new_tokens zero': case(
        'generate', GENERATE + ('--max_new_tokens=0',), '--max_new_tokens=0 is not allowed'
    ),
    'generate/longer than max_len': case(
        'generate',
        GENERATE + ('--max_new_tokens=40',),
        '--max_new_tokens=40 after a prompt of 1 token makes 41 positions; the model holds '
        'max_len=32',
    ),
    'generate/top_k above the vocabulary': case(
        'generate',
        GENERATE + ('--top_k=1000',),
        '--top_k=1000 is more than the 260 tokens of the vocabulary: use 0 (every token) or at '
        'most 260',
    ),
    'generate/top_k negative': case(
        'generate', GENERATE + ('--top_k=-1',), '--top_k=-1 is not allowed'
    ),
    'generate/temperature negative': case(
        'generate', GENERATE + ('--temperature=-0.5',), '--temperature=-0.5 is not allowed'
    ),
    'generate/temperature nan': case(
        'generate',
        GENERATE + ('--temperature=nan',),
        '--temperature=nan is not allowed: use a finite number >= 0 (0 is greedy)',
    ),
    'generate/temperature inf': case(
        'generate', GENERATE + ('--temperature=inf',), '--temperature=inf is not allowed'
    ),
    'generate/seed beyond 64 bits': case(
        'generate', GENERATE + ('--seed=' + '9' * 25,), f'--seed={"9" * 25} is not allowed'
    ),
    'generate/max_new_tokens not a number': case(
        'generate',
        GENERATE + ('--max_new_tokens=ten',),
        "--max_new_tokens=ten: invalid literal for int() with base 10: 'ten'",
    ),
    'generate/restore_step not kept': case(
        'generate',
        GENERATE + ('--config.restore_step=7',),
        'config.restore_step=7: {causal} keeps no checkpoint of step 7; its kept steps are 1, 2',
    ),
    'generate/restore_step negative': case(
        'generate',
        GENERATE + ('--config.restore_step=-1',),
        'config.restore_step=-1 is not allowed',
    ),
    'generate/a masked-LM config': case(
        'generate',
        TINY + ('--workdir={run}', '--max_new_tokens=4'),
        "config.task='masked_lm' cannot generate",
    ),
    'generate/missing workdir': case(
        'generate',
        GENERATE + ('--workdir={missing}',),
        '{missing} holds no checkpoint',
    ),
    'generate/gs without network': case(
        'generate',
        GENERATE + (GS_WORKDIR,),
        'http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    # spectrum
    'spectrum/index 0': case('spectrum', SPECTRUM + ('--index=0',), '--index=0: use a positive'),
    'spectrum/num_sequences 0': case(
        'spectrum', SPECTRUM + ('--num_sequences=0',), '--num_sequences=0: use a positive number'
    ),
    'spectrum/out is a file': case(
        'spectrum',
        SPECTRUM + ('--out={file}',),
        "--out='{file}' cannot be a folder (it is a file)",
    ),
    'spectrum/read-only workdir': case(
        'spectrum',
        TINY + ('--workdir={read_only}', '--num_sequences=4'),
        'the results printed above are not saved: {read_only}/spectrum cannot be written '
        '(Read-only file system)',
        printed='layer 1: cumulative singular value',
    ),
    'spectrum/restore_step not kept': case(
        'spectrum',
        SPECTRUM + ('--config.restore_step=7',),
        'keeps no checkpoint of step 7; its kept steps are 10, 20',
    ),
    'spectrum/missing workdir': case(
        'spectrum', TINY + ('--workdir={missing}',), '{missing} holds no checkpoint'
    ),
    'spectrum/gs without credentials': case(
        'spectrum', TINY + (GS_WORKDIR,), 'no Google Cloud credentials'
    ),
    # projection_stats
    'projection_stats/step not kept': case(
        'projection_stats',
        EVALUATE + ('--step=7',),
        '{run} keeps no checkpoint of step 7; its kept steps are 10, 20',
    ),
    'projection_stats/step negative': case(
        'projection_stats', EVALUATE + ('--step=-1',), '--step=-1 is not allowed'
    ),
    'projection_stats/restore_step not kept': case(
        'projection_stats',
        EVALUATE + ('--config.restore_step=3',),
        'config.restore_step=3: {run} keeps no checkpoint of step 3',
    ),
    'projection_stats/missing workdir': case(
        'projection_stats', TINY + ('--workdir={missing}',), '{missing} holds no checkpoint'
    ),
    'projection_stats/typo in a key': case(
        'projection_stats',
        EVALUATE + ('--config.sed=1',),
        "config has no field 'sed'; did you mean config.seed?",
    ),
    # listops_shortcuts
    'listops_shortcuts/a masked-LM run': case(
        'listops_shortcuts',
        ('--workdir={run}',),
        "{run} is a masked_lm run on 'embedded'; listops_shortcuts reads a classifier "
        "trained on config.data.source='listops'.",
    ),
    'listops_shortcuts/split not in ListOps': case(
        'listops_shortcuts',
        ('--workdir={run}', '--split=dev'),
        'flag --split=dev: value should be one of <validation|test|train>',
    ),
    'listops_shortcuts/step negative': case(
        'listops_shortcuts', ('--workdir={run}', '--step=-1'), '--step=-1 is not allowed'
    ),
    'projection_stats/gs without network': case(
        'projection_stats', TINY + (GS_WORKDIR,), 'cannot be reached', NO_NETWORK
    ),
    # sweep
    'sweep/unknown variant': case(
        'sweep', SWEEP + ('--workdir={missing}', '--only=nope'), '--only: no variant named nope'
    ),
    'sweep/typo in a set key': case(
        'sweep',
        SWEEP + ('--workdir={missing}', '--set=model.projected_lenn=1'),
        'did you mean config.model.projected_len?',
    ),
    'sweep/set to nan': case(
        'sweep',
        SWEEP + ('--workdir={missing}', '--set=learning_rate=nan'),
        '--set=learning_rate=nan',
    ),
    'sweep/workdir is a file': case(
        'sweep', SWEEP + ('--workdir={file}',), "--workdir='{file}' cannot be a folder"
    ),
    'sweep/read-only workdir': case(
        'sweep',
        SWEEP + ('--workdir={read_only_folder}',),
        "--workdir='{read_only_folder}' is not writable (Read-only file system)",
    ),
    'sweep/folder under a read-only one': case(
        'sweep',
        SWEEP + ('--workdir={read_only_folder}/sweep',),
        'is not writable: its parent {read_only_folder} is not',
    ),
    'sweep/gs workdir': case(
        'sweep', SWEEP + ('--workdir=gs://linformer-test/sweep',), 'a sweep writes its report'
    ),
    'sweep/missing sweep file': case(
        'sweep',
        ('--sweep={missing}', '--workdir={missing}'),
        '--sweep={missing}: no such file',
    ),
    'sweep/unexpected argument': case(
        'sweep', SWEEP + ('--workdir={missing}', 'extra'), 'unexpected arguments'
    ),
    # import_checkpoint
    'import_checkpoint/from a missing folder': case(
        'import_checkpoint',
        IMPORT + ('--workdir={missing}', '--from={missing}'),
        '--from={missing}: no such folder',
    ),
    'import_checkpoint/from a run of ours': case(
        'import_checkpoint',
        IMPORT + ('--workdir={missing}', '--from={run}'),
        'the folder has no tokenizer.json',
    ),
    'import_checkpoint/workdir exists': case(
        'import_checkpoint', IMPORT + ('--workdir={run}',), '--workdir={run} already exists'
    ),
    'import_checkpoint/under a read-only folder': case(
        'import_checkpoint',
        IMPORT + ('--workdir={read_only_folder}/run',),
        'is not writable: its parent {read_only_folder} is not (Read-only file system)',
    ),
    'import_checkpoint/longer than the checkpoint': case(
        'import_checkpoint',
        IMPORT + ('--workdir={missing}', '--config.model.max_len=512'),
        'config.model.max_len=512 is longer than the 64 positions',
    ),
    'import_checkpoint/gs without network': case(
        'import_checkpoint', IMPORT + (GS_WORKDIR,), 'cannot be reached', NO_NETWORK
    ),
    # prepare_data
    'prepare_data/part_index out of range': case(
        'prepare_data',
        TINY + ('--workdir={missing}', '--part_index=3', '--part_count=2'),
        '--part_index=3 is not allowed',
    ),
    'prepare_data/part_count 0': case(
        'prepare_data',
        TINY + ('--workdir={missing}', '--part_count=0'),
        '--part_count=0 is not allowed',
    ),
    'prepare_data/workdir is a file': case(
        'prepare_data',
        TINY + ('--workdir={file}',),
        "--workdir='{file}' cannot be a folder (it is a file)",
    ),
    'prepare_data/tokenizer under a read-only folder': case(
        'prepare_data',
        TINY
        + (
            '--workdir={read_only_folder}/run',
            '--config.data.tokenizer=sentencepiece',
            '--config.data.vocab_size=200',
        ),
        'is not writable: its parent {read_only_folder} is not',
    ),
    'prepare_data/unknown tokenizer': case(
        'prepare_data',
        TINY + ('--workdir={missing}', '--config.data.tokenizer=nope'),
        "config.data.tokenizer='nope' is not allowed",
    ),
    'prepare_data/typo in a key': case(
        'prepare_data',
        TINY + ('--workdir={missing}', '--config.data.tokenizr=byte'),
        'did you mean config.data.tokenizer?',
    ),
    'prepare_data/gs without credentials': case(
        'prepare_data', TINY + (GS_WORKDIR,), 'no Google Cloud credentials'
    ),
    # Paths: `~` is the home folder in every path flag and config field (none
    # is made in the working directory, and the line names the expanded path);
    # a name that is not valid UTF-8, or a gs:// path that cannot be used, is
    # refused before anything reads it.
    'train/~ in workdir, a file': case(
        'train',
        TINY + ('--workdir=~/a_file',),
        "--workdir='{file}' cannot be a run folder (File exists)",
        AT_HOME,
    ),
    'train/~ in init_from': case(
        'train',
        TRAIN + ('--config.init_from=~/nothing',),
        '{home}/nothing is not a run directory',
        AT_HOME,
    ),
    'train/~ in data.path': case(
        'train',
        TRAIN + ('--config.data.source=text_files', '--config.data.path=~/nothing'),
        "config.data.path='{home}/nothing' does not exist",
        AT_HOME,
    ),
    'train/~ in cache_dir': case(
        'train',
        TRAIN + ('--config.data.cache_dir=~/a_file',),
        "config.data.cache_dir='{file}' cannot be the data cache: {file} is a file",
        AT_HOME,
    ),
    'train/~ in compilation_cache_dir': case(
        'train',
        TRAIN + ('--config.compilation_cache_dir=~/a_file',),
        'config.compilation_cache_dir: {file} is a file, not a folder',
        AT_HOME,
    ),
    'train/~ in extensions': case(
        'train',
        TRAIN + ("--config.extensions=('~/missing.py',)",),
        "config.extensions names '{missing}.py', which is not a file",
        AT_HOME,
    ),
    'evaluate/~ in workdir': case(
        'evaluate', TINY + ('--workdir=~/missing',), '{missing} holds no checkpoint', AT_HOME
    ),
    'evaluate/~ in workdir, no config': case(
        'evaluate',
        ('--workdir=~/missing',),
        'no --config was given, and {missing}/config.json does not exist',
        AT_HOME,
    ),
    'evaluate/~ in a run folder config': case(
        'evaluate',
        ('--config=~/missing', '--workdir={run}'),
        '--config=~/missing: no such file',
        AT_HOME,
    ),
    'generate/~ in workdir': case(
        'generate', GENERATE + ('--workdir=~/missing',), '{missing} holds no checkpoint', AT_HOME
    ),
    'spectrum/~ in out': case(
        'spectrum',
        SPECTRUM + ('--out=~/a_file',),
        "--out='{file}' cannot be a folder (it is a file)",
        AT_HOME,
    ),
    'projection_stats/~ in workdir': case(
        'projection_stats',
        TINY + ('--workdir=~/missing',),
        '{missing} holds no checkpoint',
        AT_HOME,
    ),
    'prepare_data/~ in workdir, a file': case(
        'prepare_data',
        TINY + ('--workdir=~/a_file',),
        "--workdir='{file}' cannot be a folder (it is a file)",
        AT_HOME,
    ),
    'sweep/~ in the sweep file': case(
        'sweep',
        ('--sweep=~/missing', '--workdir=~/missing'),
        '--sweep={missing}: no such file',
        AT_HOME,
    ),
    'sweep/~ in workdir, a file': case(
        'sweep',
        SWEEP + ('--workdir=~/a_file',),
        "--workdir='{file}' cannot be a folder (it is a file)",
        AT_HOME,
    ),
    'import_checkpoint/~ in from': case(
        'import_checkpoint',
        IMPORT + ('--workdir={missing}', '--from=~/missing'),
        '--from={missing}: no such folder',
        AT_HOME,
    ),
    'export_checkpoint/~ in workdir': case(
        'export_checkpoint',
        ('--workdir=~/missing', '--out={missing}_out'),
        '{missing}/config.json does not exist',
        AT_HOME,
    ),
    'make_book_passages/~ in books': case(
        'make_book_passages',
        ('--books=~/missing.txt,~/a_file', '--out={missing}'),
        '{missing}.txt',
        AT_HOME,
    ),
    'train/workdir not UTF-8': case(
        'train', TINY + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'train/data.path not UTF-8': case(
        'train',
        TRAIN + ('--config.data.source=text_files', '--config.data.path={not_utf8}'),
        'config.data.path' + NOT_UTF8,
    ),
    'train/config file not UTF-8': case(
        'train', ('--config={not_utf8}', '--workdir={missing}'), '--config' + NOT_UTF8
    ),
    'evaluate/workdir not UTF-8': case(
        'evaluate', TINY + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'evaluate/workdir not UTF-8, no config': case(
        'evaluate', ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'generate/workdir not UTF-8': case(
        'generate', GENERATE + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'spectrum/out not UTF-8': case(
        'spectrum', SPECTRUM + ('--out={not_utf8}',), '--out' + NOT_UTF8
    ),
    'projection_stats/workdir not UTF-8': case(
        'projection_stats', TINY + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'prepare_data/workdir not UTF-8': case(
        'prepare_data', TINY + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'sweep/workdir not UTF-8': case(
        'sweep', SWEEP + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'import_checkpoint/workdir not UTF-8': case(
        'import_checkpoint', IMPORT + ('--workdir={not_utf8}',), '--workdir' + NOT_UTF8
    ),
    'export_checkpoint/out not UTF-8': case(
        'export_checkpoint', ('--workdir={run}', '--out={not_utf8}'), '--out' + NOT_UTF8
    ),
    'benchmark/out not UTF-8': case('benchmark', ('--out={not_utf8}',), '--out' + NOT_UTF8),
    'train/gs init_from without network': case(
        'train',
        TRAIN + ('--config.init_from=gs://linformer-test/run',),
        'config.init_from=gs://linformer-test/run: http://127.0.0.1:{refused_port} cannot be '
        'reached (Connection refused): check $STORAGE_EMULATOR_HOST, or give a local '
        'config.init_from.',
        NO_NETWORK,
    ),
    'train/gs data.path without network': case(
        'train',
        TRAIN + ('--config.data.source=text_files', '--config.data.path=gs://linformer-test/books'),
        'config.data.path=gs://linformer-test/books: http://127.0.0.1:{refused_port} cannot be '
        'reached',
        NO_NETWORK,
    ),
    'train/gs prepared_dir without network': case(
        'train',
        TRAIN + ('--config.data.prepared_dir=gs://linformer-test/prepared',),
        'config.data.prepared_dir=gs://linformer-test/prepared: http://127.0.0.1:{refused_port} '
        'cannot be reached',
        NO_NETWORK,
    ),
    'train/gs tfds_data_dir without network': case(
        'train',
        TRAIN + ('--config.data.tfds_data_dir=gs://linformer-test/tfds',),
        'config.data.tfds_data_dir=gs://linformer-test/tfds: http://127.0.0.1:{refused_port} '
        'cannot be reached',
        NO_NETWORK,
    ),
    'train/gs compilation_cache_dir without network': case(
        'train',
        TRAIN + ('--config.compilation_cache_dir=gs://linformer-test/compiled',),
        'config.compilation_cache_dir=gs://linformer-test/compiled: '
        'http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    'train/gs cache_dir': case(
        'train',
        TRAIN + ('--config.data.cache_dir=gs://linformer-test/cache',),
        "config.data.cache_dir='gs://linformer-test/cache' names an object store; the data cache "
        'is a folder on this machine: give a local folder (prepared splits are shared through '
        'gs:// with config.data.prepared_dir).',
        NO_NETWORK,
    ),
    'train/gs cache variable': case(
        'train',
        TRAIN,
        "$LINFORMER_JAX_CACHE_DIR='gs://linformer-test/cache' names an object store",
        {**NO_NETWORK, 'LINFORMER_JAX_CACHE_DIR': 'gs://linformer-test/cache'},
    ),
    'train/gs extension': case(
        'train',
        TRAIN + ("--config.extensions=('gs://linformer-test/own.py',)",),
        "config.extensions names 'gs://linformer-test/own.py': an extension is imported from a "
        'local file; copy it to this machine and name that copy.',
        NO_NETWORK,
    ),
    'train/gs workdir without network': case(
        'train', TINY + (GS_WORKDIR,), '--workdir=gs://linformer-test/run: http://', NO_NETWORK
    ),
    'evaluate/gs prepared_dir without network': case(
        'evaluate',
        EVALUATE + ('--config.data.prepared_dir=gs://linformer-test/prepared',),
        'config.data.prepared_dir=gs://linformer-test/prepared: http://127.0.0.1:{refused_port} '
        'cannot be reached',
        NO_NETWORK,
    ),
    'evaluate/gs run folder config without network': case(
        'evaluate',
        ('--config=gs://linformer-test/run', '--workdir={run}'),
        '--config=gs://linformer-test/run: http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    'evaluate/gs workdir without network, no config': case(
        'evaluate',
        (GS_WORKDIR,),
        '--workdir=gs://linformer-test/run: http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    'spectrum/gs workdir without network': case(
        'spectrum', TINY + (GS_WORKDIR,), 'cannot be reached (Connection refused)', NO_NETWORK
    ),
    'spectrum/gs out': case(
        'spectrum',
        SPECTRUM + ('--out=gs://linformer-test/spectrum',),
        "--out='gs://linformer-test/spectrum' names an object store; results are written to a "
        'local folder: give a local --out.',
        NO_NETWORK,
    ),
    'prepare_data/gs prepared_dir without network': case(
        'prepare_data',
        TRAIN + ('--config.data.prepared_dir=gs://linformer-test/prepared',),
        'config.data.prepared_dir=gs://linformer-test/prepared: http://127.0.0.1:{refused_port} '
        'cannot be reached',
        NO_NETWORK,
    ),
    'sweep/gs prepared_dir without network': case(
        'sweep',
        SWEEP + ('--workdir={missing}', '--set=data.prepared_dir=gs://linformer-test/prepared'),
        "sweep variant 'k16': config.data.prepared_dir=gs://linformer-test/prepared: "
        'http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    'import_checkpoint/gs from': case(
        'import_checkpoint',
        IMPORT + ('--workdir={missing}', '--from=gs://linformer-test/roberta'),
        "--from='gs://linformer-test/roberta' names an object store; a Hugging Face folder is "
        'read from this machine',
        NO_NETWORK,
    ),
    'export_checkpoint/gs workdir without network': case(
        'export_checkpoint',
        (GS_WORKDIR, '--out={missing}'),
        '--workdir=gs://linformer-test/run: http://127.0.0.1:{refused_port} cannot be reached',
        NO_NETWORK,
    ),
    'benchmark/gs out': case(
        'benchmark',
        ('--out=gs://linformer-test/benchmark',),
        "--out='gs://linformer-test/benchmark' names an object store",
        NO_NETWORK,
    ),
    'attention_benchmark/unexpected argument': case(
        'attention_benchmark',
        ('extra',),
        "unexpected arguments ['extra']; pass settings as --FLAG=VALUE",
    ),
    'benchmark/unexpected argument': case(
        'benchmark',
        ('--out={missing}', 'extra'),
        "unexpected arguments ['extra']; pass settings as --FLAG=VALUE",
    ),
}
# Two cases, a command reading a run and one writing many, run again through a
# plain `python -m`: the forked runner gives the lines a fresh Python gives.
FRESH_CASES = (
    'evaluate/restore_step not kept',
    'sweep/unknown variant',
)
