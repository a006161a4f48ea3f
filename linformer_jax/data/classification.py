"""Sequence-classification data: GLUE/IMDB from TSV files or TFDS, and LRA ListOps.

`config.data.source` names the registered classification source the examples
come from (`linformer_jax.data.classification_sources`):

  tsv      local files, e.g. ../shared/data/glue_sst2 (`sentence<TAB>label`) or
           ../shared/data/imdb (`label<TAB>rating<TAB>file<TAB>text`):
           config.data.path is the folder, config.data.split_files maps a split
           to its file(s), text_columns and label_column name the columns;
  tfds     a prepared TFDS dataset ('glue/sst2', 'glue/qnli', 'glue/qqp',
           'imdb_reviews'): text_columns and label_column name features;
  listops  the Long Range Arena's ListOps, generated and cached by
           `linformer_jax.data.listops` from config.data.listops, in its own
           vocabulary;
and a source of one's own, registered in a file named in config.extensions.

Texts are tokenized by the run's tokenizer (unless the source has a vocabulary
of its own): the pretrained run's SentencePiece
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

from linformer_jax.data import classification_sources
from linformer_jax.data import encoding
from linformer_jax.data import labelled_examples
from linformer_jax.data import loaders
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.data.encoding import EncodedSplit
from linformer_jax.errors import ConfigError

Batch = Dict[str, np.ndarray]
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
    split: EncodedSplit, settings: loaders.LoaderSettings
) -> loaders.BatchIterator:
  """Endless shuffled training batches of this process's shard (resumable)."""
  source = EncodedRecords(split)
  if len(source) < settings.batch_size * settings.process_count:
    raise ConfigError(
        f'The training split has {len(source)} examples, fewer than '
        f'one batch of config.batch_size={settings.batch_size * settings.process_count}.'
    )
  return loaders.shuffled_batches(source, settings)


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
  return config.data.seq_len or config.model.max_len


def _check_seq_len(config) -> None:
  if not 0 <= config.data.seq_len <= config.model.max_len:
    raise ConfigError(
        f'config.data.seq_len={config.data.seq_len} is not allowed; use 1 to '
        f'config.model.max_len={config.model.max_len}, or 0 for max_len.'
    )


def num_classes(config) -> int:
  """The number of classes a classification config asks for."""
  return classification_sources.source_of(config.data).num_classes(config.data)


def _random_subset(
    examples: labelled_examples.Examples, count: int, seed: int
) -> labelled_examples.Examples:
  """`count` examples chosen at random by `seed`, in their original order."""
  keep = np.random.default_rng(seed).permutation(len(examples.labels))
  keep = np.sort(keep[:count])
  return labelled_examples.Examples([examples.texts[i] for i in keep], examples.labels[keep])


def build_datasets(
    config, workdir: str, process_index: int = 0, process_count: int = 1, train: bool = True
) -> ClassificationDatasets:
  """Tokenizer, training iterator and evaluation batches of a classification run.

  Both splits are read and checked before a tokenizer is trained, and a new
  tokenizer is kept in `workdir` only once all of this succeeded. Without
  `train` (evaluation only), `train_iterator` is None.
  """
  _check_seq_len(config)
  data = config.data
  seq_len = sequence_length(config)
  source = classification_sources.checked_source(data, seq_len)
  batch_size, eval_batch_size = loaders.per_process_batch_sizes(config.loop, process_count)
  train_examples = source.examples(data, data.train_split)
  # ListOps trains on every example it generates: its num_train sets how many.
  if data.max_train_examples and source.own_vocab_size is None:
    train_examples = _random_subset(train_examples, data.max_train_examples, config.loop.seed)
  eval_examples = source.examples(data, data.eval_split)
  vocab_size = source.own_vocab_size
  tokenizer_context = contextlib.nullcontext(None)
  if vocab_size is None:
    tokenizer_context = _tokenizer(config, workdir, train_examples)
    vocab_size = tokenizer_files.vocab_size_of(data)
  if config.model.vocab_size != vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} does not match the '
        f'{vocab_size} tokens of the data; set config.data.vocab_size={vocab_size} '
        '(config.model.vocab_size follows it).'
    )
  with tokenizer_context as tokenizer:
    if tokenizer is None:
      train_split, evaluation = (
          source.encode(examples, seq_len) for examples in (train_examples, eval_examples)
      )
    else:
      train_split, evaluation = (
          encoding.encode_examples(examples, tokenizer, seq_len, data.truncation)
          for examples in (train_examples, eval_examples)
      )
    train_iterator = None
    if train:
      train_iterator = create_train_iterator(
          train_split,
          loaders.LoaderSettings.of_process(
              data,
              batch_size=batch_size,
              seed=config.loop.seed,
              process_index=process_index,
              process_count=process_count,
          ),
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
        train_label_counts=np.bincount(train_split.labels, minlength=source.num_classes(data)),
    )
