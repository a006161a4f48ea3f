"""ListOps (Long Range Arena): nested list operations, generated and cached here.

An example is a random expression tree over the digits 0-9 and four operators,

  MIN, MAX   the smallest / largest argument;
  MED        the median of the arguments, truncated to an int;
  SM         the sum of the arguments modulo 10;

written in prefix form with a closing bracket per operator, e.g.
`[MAX 2 9 [MIN 4 7 ] 0 ]` (value 9). The label is the value, one of 10 classes.

The recipe is the Long Range Arena's: a node is a leaf (a random digit) with
probability 0.75 while its depth is below `max_depth` (always at
`max_depth`), otherwise an operator with 2 to `max_args` arguments; trees of
`min_length` to `max_length` tokens are kept, every example is unique across
the splits (96,000 / 2,000 / 2,000 by default), and sequences are padded to
`max_length`. Generation is seeded, so the same settings give the same data,
and the splits are cached as TSV files (`Source<TAB>Target`, the LRA layout).
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import statistics
from typing import Dict, List, Sequence, Tuple, Union

OPERATORS = ('MIN', 'MAX', 'MED', 'SM')
CLOSE = ']'
DIGITS = tuple(str(d) for d in range(10))
NUM_CLASSES = 10
# Token ids: 0 pads, then the vocabulary below. A model reads ListOps with
# mean pooling (config.model.pooling='mean'), so no classification token is
# added and a 2,000-token tree fills n = 2,000 exactly.
PAD_ID = 0
VOCABULARY = DIGITS + tuple('[' + op for op in OPERATORS) + (CLOSE,)
TOKEN_IDS = {token: index + 1 for index, token in enumerate(VOCABULARY)}
VOCAB_SIZE = len(VOCABULARY) + 1

Tree = Union[int, Tuple[str, List['Tree']]]


@dataclasses.dataclass(frozen=True)
class ListOpsSettings:
  """What is generated; every field is part of the cache key."""

  num_train: int = 96_000  # unique training examples
  num_validation: int = 2_000  # unique validation examples
  num_test: int = 2_000  # unique test examples
  min_length: int = 500  # shortest kept tree, in tokens
  max_length: int = 2_000  # longest kept tree, in tokens (and the padded length)
  max_depth: int = 10  # depth at which every node is a leaf
  max_args: int = 10  # most arguments of an operator (at least 2)
  leaf_probability: float = 0.75  # chance a node above max_depth is a leaf
  seed: int = 0  # seeds the generator

  def __post_init__(self):
    for name in ('num_train', 'num_validation', 'num_test'):
      if getattr(self, name) < 1:
        raise ValueError(f'ListOps {name}={getattr(self, name)} is not allowed; use at least 1.')
    if not 1 <= self.min_length <= self.max_length:
      raise ValueError(
          f'ListOps min_length={self.min_length} and max_length='
          f'{self.max_length} are not allowed; use 1 <= min_length '
          '<= max_length.'
      )
    if self.max_depth < 1 or self.max_args < 2:
      raise ValueError(
          f'ListOps max_depth={self.max_depth}, max_args='
          f'{self.max_args} are not allowed; use max_depth >= 1 '
          'and max_args >= 2.'
      )
    if not 0.0 <= self.leaf_probability < 1.0:
      raise ValueError(
          f'ListOps leaf_probability={self.leaf_probability} is not '
          'allowed; use a value in [0, 1).'
      )

  @property
  def split_sizes(self) -> Dict[str, int]:
    return {'train': self.num_train, 'validation': self.num_validation, 'test': self.num_test}


class _TooLong(Exception):
  """Raised while growing a tree that already exceeds the length limit."""


def _grow(rng: random.Random, depth: int, settings: ListOpsSettings, budget: List[int]) -> Tree:
  """A random subtree; `budget[0]` counts the tokens still allowed."""
  budget[0] -= 1
  if budget[0] < 0:
    raise _TooLong
  if depth >= settings.max_depth or rng.random() < settings.leaf_probability:
    return rng.randrange(10)
  budget[0] -= 1  # the closing bracket
  num_args = rng.randint(2, settings.max_args)
  operator = rng.choice(OPERATORS)
  return operator, [_grow(rng, depth + 1, settings, budget) for _ in range(num_args)]


def random_tree(rng: random.Random, settings: ListOpsSettings) -> Union[Tree, None]:
  """A tree drawn by the recipe, or None if it has more than max_length tokens.

  Growth stops as soon as the limit is passed; since such trees are dropped
  anyway, this keeps the distribution of the kept trees unchanged.
  """
  try:
    return _grow(rng, 1, settings, [settings.max_length])
  except _TooLong:
    return None


def evaluate(tree: Tree) -> int:
  """The value of a tree, in 0..9."""
  if isinstance(tree, int):
    return tree
  operator, args = tree
  values = [evaluate(arg) for arg in args]
  if operator == 'MIN':
    return min(values)
  if operator == 'MAX':
    return max(values)
  if operator == 'MED':
    return int(statistics.median(values))
  if operator == 'SM':
    return sum(values) % 10
  raise ValueError(f'unknown ListOps operator {operator!r}')


def tokens(tree: Tree) -> List[str]:
  """The prefix form: '[OP', the arguments, ']'; digits are single tokens."""
  if isinstance(tree, int):
    return [str(tree)]
  operator, args = tree
  out = ['[' + operator]
  for arg in args:
    out.extend(tokens(arg))
  out.append(CLOSE)
  return out


def parse(source: str) -> Tree:
  """The tree of a source string (the inverse of ' '.join(tokens(tree)))."""
  parts = source.split()
  position = 0

  def node() -> Tree:
    nonlocal position
    if position >= len(parts):
      raise ValueError(f'ListOps source ends inside an operator: {source[:80]!r}')
    token = parts[position]
    position += 1
    if token in DIGITS:
      return int(token)
    if not token.startswith('[') or token[1:] not in OPERATORS:
      raise ValueError(f'unknown ListOps token {token!r} in {source[:80]!r}')
    args = []
    while position < len(parts) and parts[position] != CLOSE:
      args.append(node())
    if position >= len(parts):
      raise ValueError(f'ListOps source ends inside an operator: {source[:80]!r}')
    position += 1  # the closing bracket
    return token[1:], args

  tree = node()
  if position != len(parts):
    raise ValueError(f'ListOps source has tokens after the expression: {source[:80]!r}')
  return tree


def generate(settings: ListOpsSettings) -> Dict[str, List[Tuple[str, int]]]:
  """(source, label) pairs per split; unique across splits, kept lengths only."""
  rng = random.Random(settings.seed)
  seen = set()
  splits = {}
  for split, size in settings.split_sizes.items():
    examples = []
    while len(examples) < size:
      tree = random_tree(rng, settings)
      if tree is None:
        continue
      source_tokens = tokens(tree)
      if len(source_tokens) < settings.min_length:
        continue
      source = ' '.join(source_tokens)
      if source in seen:
        continue
      seen.add(source)
      examples.append((source, evaluate(tree)))
    splits[split] = examples
  return splits


def _cache_folder(settings: ListOpsSettings, cache_root: pathlib.Path) -> pathlib.Path:
  key = json.dumps(dataclasses.asdict(settings), sort_keys=True)
  return cache_root / 'listops' / hashlib.sha256(key.encode()).hexdigest()[:16]


def read_tsv(path: Union[str, os.PathLike]) -> List[Tuple[str, int]]:
  """(source, label) pairs of a `Source<TAB>Target` file (with that header)."""
  examples = []
  with open(path) as f:
    header = f.readline().rstrip('\n').split('\t')
    if header != ['Source', 'Target']:
      raise ValueError(
          f"{path}: the first line must be the header 'Source<TAB>Target', not {header!r}."
      )
    for line_number, line in enumerate(f, start=2):
      fields = line.rstrip('\n').split('\t')
      if len(fields) != 2 or fields[1] not in DIGITS:
        raise ValueError(
            f'{path}:{line_number}: expected a source, a tab and a '
            f'label 0-9, got {line[:80]!r}.'
        )
      examples.append((fields[0], int(fields[1])))
  return examples


def load_or_generate(
    settings: ListOpsSettings, cache_root: Union[str, os.PathLike]
) -> Dict[str, List[Tuple[str, int]]]:
  """The splits, generated once and then read from CACHE_ROOT/listops/KEY/*.tsv."""
  folder = _cache_folder(settings, pathlib.Path(cache_root))
  names = list(settings.split_sizes)
  if all((folder / f'{name}.tsv').exists() for name in names):
    return {name: read_tsv(folder / f'{name}.tsv') for name in names}
  splits = generate(settings)
  folder.mkdir(parents=True, exist_ok=True)
  for name, examples in splits.items():
    partial = folder / f'{name}.tsv.partial'
    with open(partial, 'w') as f:
      f.write('Source\tTarget\n')
      f.writelines(f'{source}\t{label}\n' for source, label in examples)
    os.replace(partial, folder / f'{name}.tsv')  # complete files only
  return splits


def load_split(
    settings: ListOpsSettings, cache_root: Union[str, os.PathLike], split: str
) -> List[Tuple[str, int]]:
  """One split of `load_or_generate`, read alone from the cache when all
  splits are there (a large training split is not read for evaluation)."""
  folder = _cache_folder(settings, pathlib.Path(cache_root))
  if all((folder / f'{name}.tsv').exists() for name in settings.split_sizes):
    return read_tsv(folder / f'{split}.tsv')
  return load_or_generate(settings, cache_root)[split]


def encode(source: str, seq_len: int) -> List[int]:
  """Token ids of a source, padded up to seq_len."""
  try:
    ids = [TOKEN_IDS[token] for token in source.split()]
  except KeyError as error:
    raise ValueError(f'unknown ListOps token {error.args[0]!r} in {source[:80]!r}') from None
  if len(ids) > seq_len:
    raise ValueError(
        f'a ListOps example of {len(ids)} tokens does not '
        f'fit model.max_len={seq_len}; raise model.max_len or lower '
        "the generator's max_length."
    )
  return ids + [PAD_ID] * (seq_len - len(ids))


def length_histogram(examples: Sequence[Tuple[str, int]]) -> List[int]:
  """Token counts of the sources (for checking the length distribution)."""
  return [len(source.split()) for source, _ in examples]
