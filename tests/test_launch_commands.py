"""docs/scaling.md's launch commands run as written, through their first step.

Each `python -m linformer_jax.train` of the page's "Launching" section runs on
8 CPU devices: the platform becomes cpu, the multi-host flags (one process
here) are dropped, shared folders (gs:// buckets, /shared) become local ones,
and a tiny model on a tiny folder of books replaces the RoBERTa-base one. The
data source, mesh, FSDP and cache flags stay as the page gives them.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / 'docs' / 'scaling.md'
MULTI_HOST_FLAGS = ('--coordinator_address', '--num_processes', '--process_id')
TINY = (
    '--config.model.num_layers=1',
    '--config.model.num_heads=8',
    '--config.model.hidden_dim=64',
    '--config.model.mlp_dim=64',
    '--config.model.max_len=32',
    '--config.model.projected_len=8',
    '--config.data.tokenizer=byte',
    '--config.data.vocab_size=260',
    "--config.data.split_files={'validation': ['c.txt']}",
    '--config.data.max_eval_batches=1',
    '--config.batch_size=8',
    '--config.eval_batch_size=8',
    '--config.total_steps=1',
    '--config.warmup_steps=0',
    '--config.log_every=1',
    '--config.eval_every=1',
    '--config.checkpoint_every=1',
)


def launch_commands():
  """The train commands of the Launching section: fenced blocks and inline ones."""
  text = PAGE.read_text()
  section = text[text.index('## Launching') :]
  section = section[: section.index('\n## ', 1)]
  commands = []
  for block in re.findall(r'```\n(.*?)```', section, flags=re.S):
    joined = block.replace('\\\n', ' ')
    commands += [line for line in joined.splitlines() if 'linformer_jax.train' in line]
  inline = r'--command="([^"]*linformer_jax\.train[^"]*)"'
  for command in re.findall(inline, section.replace('\n', ' ')):
    commands.append(command.split('&&')[-1])
  return commands


def test_the_page_has_launch_commands():
  commands = launch_commands()
  assert len(commands) >= 4, commands
  assert any('--config.platform=tpu' in command for command in commands)


def _as_run_here(command: str, books: pathlib.Path, scratch: pathlib.Path):
  """The command as this host runs it: its workdir and buckets under `scratch`."""
  words = shlex.split(command, comments=True)
  assert words[:3] == ['.venv/bin/python', '-m', 'linformer_jax.train'], words
  args, words = [], iter(words[3:])
  for word in words:
    if word == '--workdir':
      next(words)  # '--workdir PATH' as two words
      continue
    if word.startswith(MULTI_HOST_FLAGS + ('--workdir=',)):
      continue
    if word.startswith('--config.platform='):
      word = '--config.platform=cpu'
    args.append(word.replace('gs://BUCKET/', f'{scratch}/bucket/'))
  workdir = f'--workdir={scratch}/run'
  return [
      sys.executable,
      '-m',
      'linformer_jax.train',
      workdir,
      *args,
      f'--config.data.path={books}',
      *TINY,
  ]


# The pod command on buckets (prepared data, compilation cache) runs in `make
# test`; the others, about 30 s each, in `make test-all`.
IN_MAKE_TEST = 2


@pytest.mark.slow
@pytest.mark.parametrize(
    'index',
    [
        index if index == IN_MAKE_TEST else pytest.param(index, marks=pytest.mark.long)
        for index in range(4)
    ],
)
def test_each_launch_command_runs_its_first_step(index, books, tmp_path):
  commands = launch_commands()
  if index >= len(commands):
    pytest.skip('fewer commands on the page')
  argv = _as_run_here(commands[index], books, tmp_path)
  env = {
      **os.environ,
      'PYTHONPATH': str(REPO),
      'JAX_PLATFORMS': 'cpu',
      'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
  }
  result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  output = result.stdout + result.stderr
  assert result.returncode == 0, f'{commands[index]}\n{output[-3000:]}'
  assert 'backend cpu: 8 devices' in output
  assert re.search(r'step 1: validation loss', output), output[-2000:]
