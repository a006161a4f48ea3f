"""Preparation's memory stays flat as the corpus grows (in a subprocess, so the
measurement is of preparation alone)."""

import json

import numpy as np
import pytest

_WORDS = (
    'attention',
    'linear',
    'sequence',
    'project',
    'keys',
    'values',
    'the',
    'of',
    'low',
    'rank',
    'matrix',
    'softmax',
    'tokens',
    'layer',
    'head',
    'and',
)


def english_like_text(rng, paragraphs):
  """Seeded paragraphs of words, separated by blank lines."""
  return (
      '\n\n'.join(' '.join(rng.choice(_WORDS, size=rng.integers(5, 60))) for _ in range(paragraphs))
      + '\n\n'
  )


_MEMORY_SCRIPT = '''
"""Prepares the one file at argv[1] (in 1 MiB blocks) and prints the peaks."""
import json
import pathlib
import resource
import sys
import time
import tracemalloc

from linformer_jax.data import prepare
from linformer_jax.data import tokenizer
from linformer_jax.data.sources import text_files

path = pathlib.Path(sys.argv[1])
text_files.FILE_BLOCK_BYTES = 2**20
data = {'source': 'text_files', 'path': str(path), 'split_files': {}}
byte_tokenizer = tokenizer.ByteTokenizer()
signature = prepare.split_signature(data, 'train', byte_tokenizer, 32)
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
tracemalloc.start()
manifest = prepare.prepare_part(
    data, 'train', path.parent / 'prepared', tokenizer=byte_tokenizer, seq_len=32,
    signature=signature, workers=0,
)
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({
    'traced_peak': peak,
    'rss_growth': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before,
    'sequences': manifest['sequences'],
    'seconds': time.perf_counter() - start,
}))
'''


@pytest.mark.long
@pytest.mark.slow
def test_memory_does_not_grow_with_the_corpus(tmp_path, run_python):
  """Preparing a 20 MiB file takes the memory a 5 MiB one does (both read in
  1 MiB blocks, tokenized in this process): the same traced peak, and a peak
  RSS that grows by about as much."""
  script = tmp_path / 'prepare_memory.py'
  script.write_text(_MEMORY_SCRIPT)
  chunk = english_like_text(np.random.default_rng(4), 8000).encode()
  chunk = chunk[: chunk.rindex(b'\n\n', 0, 2**20) + 2]  # whole paragraphs, < 1 MiB
  reports = {}
  # 5 and 20 MiB, not 10 and 40: the same 4x ratio in half the time (~10 s).
  for mebibytes in (5, 20):
    folder = tmp_path / f'corpus{mebibytes}'
    folder.mkdir()
    path = folder / 'big.txt'
    with path.open('wb') as f:
      for _ in range(mebibytes):
        f.write(chunk + b'\n' * (2**20 - len(chunk)))  # 1 MiB each
    result = run_python(script, path, timeout=240)
    assert result.returncode == 0, result.stderr
    reports[mebibytes] = json.loads(result.stdout.strip().splitlines()[-1])
  small, large = reports[5], reports[20]
  assert 3.9 < large['sequences'] / small['sequences'] < 4.1
  assert large['traced_peak'] < 1.3 * small['traced_peak'], reports
  # RSS growth is noisy (18-46 MB at either size, as the allocator reuses the
  # imports' pages or not), so it gets a margin; holding the split would add
  # 60+ MB (15 MiB more text as 4-byte tokens, and rows of bos/eos).
  assert large['rss_growth'] < small['rss_growth'] + 32 * 2**20, reports
