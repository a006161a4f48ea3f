"""The ListOps generator: hand-checked values, the recipe's lengths, caching, encoding.

Values and token ids are written out by hand; the length and leaf statistics
are compared with the LRA recipe's settings.
"""

import os
import random
import statistics

import pytest

from linformer_jax.data import listops

SMALL = dict(num_train=300, num_validation=30, num_test=30)


@pytest.mark.parametrize(
    'source, value',
    [
        ('[MAX 2 9 [MIN 4 7 ] 0 ]', 9),
        ('[MIN 4 7 ]', 4),
        ('[MED 1 8 3 ]', 3),
        ('[MED 1 8 ]', 4),  # median 4.5, truncated
        ('[MED 0 9 0 9 ]', 4),  # median 4.5
        ('[SM 5 9 3 ]', 7),  # 17 mod 10
        ('[SM [MAX 9 1 ] [MIN 8 9 ] 3 ]', 0),  # 9 + 8 + 3 = 20
        ('[MED [SM 6 6 ] [MAX 0 3 ] 7 [MIN 5 9 ] ]', 4),  # median(2, 3, 7, 5) = 4
        ('[MIN [MAX 2 [MED 7 [SM 3 4 ] 8 ] ] 9 ]', 7),  # MED(7, 7, 8) = 7
        ('6', 6),
    ],
)
def test_hand_checked_values(source, value):
  tree = listops.parse(source)
  assert listops.evaluate(tree) == value
  assert ' '.join(listops.tokens(tree)) == source


@pytest.fixture(scope='module')
def splits():
  return listops.generate(listops.ListOpsSettings(**SMALL))


def test_splits_have_the_asked_sizes_and_are_unique_across_splits(splits):
  assert {name: len(examples) for name, examples in splits.items()} == {
      'train': 300,
      'validation': 30,
      'test': 30,
  }
  sources = [source for examples in splits.values() for source, _ in examples]
  assert len(set(sources)) == len(sources)


def test_lengths_follow_the_recipe(splits):
  settings = listops.ListOpsSettings(**SMALL)
  lengths = listops.length_histogram(splits['train'])
  assert min(lengths) >= 500 and max(lengths) <= 2000
  # Kept trees are mostly short: a heavy tail above the 500-token floor.
  assert statistics.median(lengths) < 1200
  assert sum(length > 1500 for length in lengths) > 0
  # The labels are every digit, and evaluation agrees with the stored label.
  assert {label for _, label in splits['train']} == set(range(10))
  for source, label in splits['train'][:50]:
    tree = listops.parse(source)
    assert listops.evaluate(tree) == label
    assert _depth(tree) <= settings.max_depth
    assert _max_args(tree) <= settings.max_args


def _depth(tree) -> int:
  if isinstance(tree, int):
    return 1
  return 1 + max(_depth(arg) for arg in tree[1])


def _max_args(tree) -> int:
  if isinstance(tree, int):
    return 0
  return max([len(tree[1])] + [_max_args(arg) for arg in tree[1]])


def test_unconstrained_trees_match_the_leaf_probability():
  # With no length floor, the root is a leaf with probability 0.75.
  settings = listops.ListOpsSettings(min_length=1, max_length=100_000)
  rng = random.Random(1)
  roots = [listops.random_tree(rng, settings) for _ in range(4000)]
  leaves = sum(isinstance(tree, int) for tree in roots) / len(roots)
  assert leaves == pytest.approx(0.75, abs=0.03)
  operators = [tree for tree in roots if not isinstance(tree, int)]
  counts = [len(tree[1]) for tree in operators]
  assert min(counts) == 2 and max(counts) == 10
  assert statistics.mean(counts) == pytest.approx(6, abs=0.4)


def test_generation_is_seeded_and_cached(tmp_path, splits):
  settings = listops.ListOpsSettings(**SMALL)
  loaded = listops.load_or_generate(settings, tmp_path)
  assert loaded == splits  # same seed, same data
  (folder,) = (tmp_path / 'listops').iterdir()
  assert sorted(os.listdir(folder)) == ['test.tsv', 'train.tsv', 'validation.tsv']
  # The cache is read back, not regenerated: edit it and see the edit.
  with open(folder / 'test.tsv', 'w') as f:
    f.write('Source\tTarget\n[MIN 4 7 ]\t4\n')
  assert listops.load_or_generate(settings, tmp_path)['test'] == [('[MIN 4 7 ]', 4)]
  other = listops.generate(listops.ListOpsSettings(**dict(SMALL, seed=1)))
  assert other['train'] != splits['train']


def test_encode_pads_and_rejects_what_does_not_fit():
  # The ids are part of every checkpoint: 0 pads, digits 0-9 are 1-10, then
  # [MIN 11, [MAX 12, [MED 13, [SM 14 and ] 15; 16 ids in all.
  assert listops.encode('[MAX 2 9 ]', 6) == [12, 3, 10, 15, 0, 0]
  assert listops.encode('[SM 0 [MIN 9 ] [MED 1 ] ]', 10) == [14, 1, 11, 10, 15, 13, 2, 15, 15, 0]
  assert listops.VOCAB_SIZE == 16
  assert listops.encode('[MAX 2 9 ]', 4) == [12, 3, 10, 15]
  with pytest.raises(ValueError, match='model.max_len=3'):
    listops.encode('[MAX 2 9 ]', 3)
  with pytest.raises(ValueError, match="'\\[ADD'"):
    listops.encode('[ADD 2 9 ]', 8)


@pytest.mark.parametrize(
    'content, message',
    [
        ('Source\tLabel\n', 'header'),
        ('Source\tTarget\n[MIN 4 7 ]\t12\n', ':2: expected'),
        ('Source\tTarget\n[MIN 4 7 ]\n', ':2: expected'),
    ],
)
def test_bad_tsv_files_name_the_file_and_line(tmp_path, content, message):
  path = tmp_path / 'bad.tsv'
  path.write_text(content)
  with pytest.raises(ValueError, match=message) as error:
    listops.read_tsv(path)
  assert 'bad.tsv' in str(error.value)


@pytest.mark.parametrize(
    'overrides',
    [
        dict(num_train=0),
        dict(min_length=10, max_length=5),
        dict(max_args=1),
        dict(leaf_probability=1.0),
    ],
)
def test_bad_settings_are_refused(overrides):
  with pytest.raises(ValueError, match='ListOps'):
    listops.ListOpsSettings(**overrides)


def test_malformed_sources_are_refused():
  with pytest.raises(ValueError, match='ends inside'):
    listops.parse('[MIN 4 7')
  with pytest.raises(ValueError, match='after the expression'):
    listops.parse('[MIN 4 7 ] 3')
