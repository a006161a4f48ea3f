"""Sequence-classification data: GLUE/IMDB from TSV files or TFDS, and LRA ListOps.

`config.data.source` chooses where the examples come from:

  tsv      local files, e.g. ../shared/data/glue_sst2 (`sentence<TAB>label`) or
           ../shared/data/imdb (`label<TAB>rating<TAB>file<TAB>text`):
           config.data.path is the folder, config.data.split_files maps a split
           to its file(s), text_columns and label_column name the columns;
  tfds     a prepared TFDS dataset ('glue/sst2', 'glue/qnli', 'glue/qqp',
           'imdb_reviews'): text_columns and label_column name features;
  listops  the Long Range Arena's ListOps, generated and cached by
           `linformer_jax.data.listops` from config.data.listops.
`linformer_jax.data.labelled_examples` reads the tsv and tfds examples.

Texts are tokenized by the run's tokenizer: the pretrained run's SentencePiece
model or tokenizer.json (copied from config.init_from), one trained on the
training texts, or
bytes (`tokenizer='byte'`, the LRA's byte-level text task), and laid out by
`linformer_jax.data.encoding` in rows of n = config.data.seq_len tokens
(model.max_len when 0). A shorter n than max_len gives the same outputs for
every text that fits, since padding never reaches real tokens, and costs less.

Every batch is a dict of numpy arrays:
  inputs        int32 [batch, n], token ids
  padding_mask  bool [batch, n], True for real tokens
  segments      int32 [batch, n], 0 for the first text, 1 for the second
  labels        int32 [batch], the class index in config.data.labels
  weights       float32 [batch], 1.0 for examples, 0.0 for filler rows
"""

import contextlib
import hashlib
import math
import pathlib
from typing import ContextManager, Dict, List, NamedTuple, Optional

import grain
import numpy as np

from linformer_jax.data import cache
from linformer_jax.data import encoding
from linformer_jax.data import labelled_examples
from linformer_jax.data import listops
from linformer_jax.data import loaders
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.data.encoding import EncodedSplit
from linformer_jax.errors import ConfigError

Batch = Dict[str, np.ndarray]
SOURCES = ('tsv', 'tfds', 'listops')
TRUNCATIONS = ('head', 'head_tail')
# Chooses the evaluation subset when config.data.max_eval_batches caps it.
EVAL_SUBSET_SEED = 0


class EncodedRecords(grain.sources.RandomAccessDataSource):
  """A grain source over an EncodedSplit; its repr digests the data (grain
  refuses to restore an iterator state onto other data)."""

  def __init__(self, split: EncodedSplit):
    self._split = split
    digest = hashlib.sha256()
    for array in (split.inputs, split.segments, split.labels):
      digest.update(np.ascontiguousarray(array).tobytes())
    self._digest = digest.hexdigest()[:16]

  def __len__(self) -> int:
    return len(self._split.labels)

  def __getitem__(self, index: int) -> Batch:
    inputs = self._split.inputs[index]
    return {
        'inputs': inputs,
        'padding_mask': inputs != self._split.pad_id,
        'segments': self._split.segments[index],
        'labels': self._split.labels[index],
        'weights': np.float32(1.0),
    }

  def __repr__(self) -> str:
    return f'EncodedRecords(examples={len(self)}, digest={self._digest})'


def create_train_iterator(
    split: EncodedSplit,
    *,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    worker_count: int = 0,
    read_threads: int = 0,
    prefetch_buffer: int = 0,
) -> loaders.BatchIterator:
  """Endless shuffled training batches of this process's shard (resumable);
  read_threads and prefetch_buffer as `loaders.shuffled_batches` takes them."""
  source = EncodedRecords(split)
  if len(source) < batch_size * process_count:
    raise ConfigError(
        f'The training split has {len(source)} examples, fewer than '
        f'one batch of config.batch_size={batch_size * process_count}.'
    )
  return loaders.shuffled_batches(
      source,
      batch_size=batch_size,
      seed=seed,
      process_index=process_index,
      process_count=process_count,
      worker_count=worker_count,
      read_threads=read_threads,
      prefetch_buffer=prefetch_buffer,
  )


def create_eval_batches(
    split: EncodedSplit,
    *,
    batch_size: int,
    max_batches: Optional[int] = None,
    process_index: int = 0,
    process_count: int = 1,
) -> List[Batch]:
  """Every evaluation example once, dealt round-robin to the processes; the
  last batches are filled with weight-0 rows so every process has as many.

  With `max_batches`, a fixed random subset of that many batches' examples
  (the same for every run): files such as IMDB's list one class after the
  other, so their first rows would hold a single label.
  """
  source = EncodedRecords(split)
  chosen = np.arange(len(source))
  if max_batches and max_batches * batch_size * process_count < len(source):
    subset = np.random.default_rng(EVAL_SUBSET_SEED).permutation(len(source))
    chosen = np.sort(subset[: max_batches * batch_size * process_count])
  indices = chosen[process_index::process_count]
  num_batches = math.ceil(math.ceil(len(chosen) / process_count) / batch_size)
  batches = []
  for b in range(num_batches):
    rows = [source[int(i)] for i in indices[b * batch_size : (b + 1) * batch_size]]
    filler = dict(source[0], weights=np.float32(0.0))
    rows += [filler] * (batch_size - len(rows))
    batches.append({key: np.stack([row[key] for row in rows]) for key in rows[0]})
  return batches


class ClassificationDatasets(NamedTuple):
  """What `build_datasets` returns for a classification run."""

  tokenizer: Optional[tokenizer_lib.Tokenizer]  # None for ListOps (own vocabulary)
  train_iterator: Optional[loaders.BatchIterator]  # None for evaluation only
  eval_batches: List[Batch]
  train_sequences: int
  eval_sequences: int
  train_label_counts: np.ndarray  # [num_classes] training examples per class

  @property
  def tokenizer_sha256(self) -> Optional[str]:
    """sha256 of WORKDIR/tokenizer.model, None without one: checkpoints keep it."""
    return self.tokenizer.sha256 if self.tokenizer else None


def _listops_splits(config, seq_len: int) -> Dict[str, EncodedSplit]:
  settings = listops.ListOpsSettings(**dict(config.data.listops))
  if settings.max_length > seq_len:
    raise ConfigError(
        f'config.data.listops.max_length={settings.max_length} is '
        f'longer than config.model.max_len={seq_len}; raise max_len.'
    )
  cache_root = cache.cache_root(config.data.cache_dir)
  splits = {}
  for name, examples in listops.load_or_generate(settings, cache_root).items():
    inputs = np.asarray([listops.encode(s, seq_len) for s, _ in examples], np.int32)
    splits[name] = EncodedSplit(
        inputs,
        np.zeros_like(inputs),
        np.asarray([label for _, label in examples], np.int32),
        listops.PAD_ID,
    )
  return splits


def _tokenizer(
    config, workdir: str, train_examples: labelled_examples.Examples
) -> ContextManager[tokenizer_lib.Tokenizer]:
  """The pretrained run's tokenizer file (SentencePiece model or tokenizer.json)
  when fine-tuning, else the config's; a new one is kept in the workdir only if
  the `with` block succeeds."""
  data = config.data
  pretrained = None
  filename = tokenizer_lib.FILENAMES.get(data.tokenizer)
  if filename and config.init_from:
    pretrained = pathlib.Path(config.init_from) / filename
    target = pathlib.Path(workdir) / filename
    if not target.exists() and not pretrained.exists():
      raise ConfigError(
          f'config.init_from={config.init_from!r} has no {filename}; point '
          'it at a pretraining run, or set config.data.tokenizer=byte.'
      )
  return tokenizer_files.workdir_tokenizer(
      data,
      workdir,
      lambda: [' '.join(t) for t in train_examples.texts],
      pretrained_model=str(pretrained) if pretrained else None,
  )


def sequence_length(config) -> int:
  """Tokens per example: config.data.seq_len, or model.max_len when it is 0."""
  return config.data.get('seq_len', 0) or config.model.max_len


def _check_fields(config) -> None:
  data = config.data
  if not 0 <= data.get('seq_len', 0) <= config.model.max_len:
    raise ConfigError(
        f'config.data.seq_len={data.seq_len} is not allowed; use 1 to '
        f'config.model.max_len={config.model.max_len}, or 0 for max_len.'
    )
  if data.source not in SOURCES:
    raise ConfigError(
        f'config.data.source={data.source!r} is not allowed for '
        f'task=classification; use one of {SOURCES}.'
    )
  if data.source == 'listops':
    return
  if data.truncation not in TRUNCATIONS:
    raise ConfigError(
        f'config.data.truncation={data.truncation!r} is not allowed; use one of {TRUNCATIONS}.'
    )
  if len(data.labels) < 2 or len(set(map(str, data.labels))) != len(data.labels):
    raise ConfigError(
        f'config.data.labels={tuple(data.labels)} is not allowed; give '
        'two or more distinct labels.'
    )
  if len(data.text_columns) not in (1, 2):
    raise ConfigError(
        f'config.data.text_columns={tuple(data.text_columns)} is not '
        'allowed; name 1 (single texts) or 2 (pairs) columns.'
    )


def num_classes(config) -> int:
  """The number of classes a classification config asks for."""
  if config.data.source == 'listops':
    return listops.NUM_CLASSES
  return len(config.data.labels)


def build_datasets(
    config, workdir: str, process_index: int = 0, process_count: int = 1, train: bool = True
) -> ClassificationDatasets:
  """Tokenizer, training iterator and evaluation batches of a classification run.

  Both splits are read and checked before a tokenizer is trained, and a new
  tokenizer is kept in `workdir` only once all of this succeeded. Without
  `train` (evaluation only), `train_iterator` is None.
  """
  _check_fields(config)
  data = config.data
  seq_len = sequence_length(config)
  batch_size, eval_batch_size = loaders.per_process_batch_sizes(config, process_count)
  tokenizer_context = contextlib.nullcontext(None)
  if data.source == 'listops':
    splits = _listops_splits(config, seq_len)
    for split in (data.train_split, data.eval_split):
      if split not in splits:
        raise ConfigError(
            f'ListOps has splits {tuple(splits)}, not {split!r}; '
            'change config.data.train_split/eval_split.'
        )
    train_split, evaluation = splits[data.train_split], splits[data.eval_split]
    vocab_size = listops.VOCAB_SIZE
  else:
    train_examples = labelled_examples.load_examples(data, data.train_split)
    if data.max_train_examples:
      keep = np.random.default_rng(config.seed).permutation(len(train_examples.labels))
      keep = np.sort(keep[: data.max_train_examples])
      train_examples = labelled_examples.Examples(
          [train_examples.texts[i] for i in keep], train_examples.labels[keep]
      )
    eval_examples = labelled_examples.load_examples(data, data.eval_split)
    tokenizer_context = _tokenizer(config, workdir, train_examples)
    vocab_size = tokenizer_files.vocab_size_of(data)
  if config.model.vocab_size != vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} does not match the '
        f'{vocab_size} tokens of the data; set config.data.vocab_size={vocab_size} '
        '(config.model.vocab_size follows it).'
    )
  with tokenizer_context as tokenizer:
    if tokenizer is not None:
      train_split, evaluation = (
          encoding.encode_examples(examples, tokenizer, seq_len, data.truncation)
          for examples in (train_examples, eval_examples)
      )
    train_iterator = None
    if train:
      train_iterator = create_train_iterator(
          train_split,
          batch_size=batch_size,
          seed=config.seed,
          process_index=process_index,
          process_count=process_count,
          worker_count=data.worker_count,
          read_threads=data.get('read_threads', 0),
          prefetch_buffer=data.get('prefetch_buffer', 0),
      )
    eval_batches = create_eval_batches(
        evaluation,
        batch_size=eval_batch_size,
        max_batches=data.max_eval_batches or None,
        process_index=process_index,
        process_count=process_count,
    )
    return ClassificationDatasets(
        tokenizer=tokenizer,
        train_iterator=train_iterator,
        eval_batches=eval_batches,
        train_sequences=len(train_split.labels),
        eval_sequences=len(evaluation.labels),
        train_label_counts=np.bincount(train_split.labels, minlength=num_classes(config)),
    )
