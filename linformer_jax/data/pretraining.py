"""The pretraining input pipeline that masked and causal language modelling share.

A run's tokenizer lives in its workdir (trained on a bounded sample of the
training split the first time); the train and eval splits are prepared once as
ArrayRecord shards of packed rows (`prepare`, `packing`: `[bos] chunk [eos]`
rows of seq_len tokens) and read with random access (`packed_batches`). The
training iterator shuffles the rows, shards them over processes and can be
restored from its state; evaluation batches are deterministic. What makes a
training example of a row is the task's *transform*, an argument here:
`masked_lm` masks (a whole training batch at once: its `on_batches`),
`causal_lm` sets next-token targets row by row. A random transform (a grain
`RandomMap`) draws from a generator grain derives from the seed and the row's
(or batch's) position in the stream, so the same seed gives the same batches
and a restored iterator continues exactly.

Every batch is a dict of numpy arrays of shape [batch, seq_len] with the keys
the transform gives; the masked and causal ones give
  inputs        int32, the model's input
  targets       int32, the tokens to predict
  weights       float32, 1.0 at the loss positions, else 0.0
  padding_mask  bool, True for real tokens (bos and eos included)
"""

import contextlib
import pathlib
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import numpy as np

from linformer_jax import storage
from linformer_jax.data import loaders
from linformer_jax.data import packed_batches
from linformer_jax.data import prepare
from linformer_jax.data import remote_splits
from linformer_jax.data import shards
from linformer_jax.data import sources
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data import tokenizer_files
from linformer_jax.data import units
from linformer_jax.errors import ConfigError

# Evaluation draws a random transform's choices (masking) from this seed
# whatever config.seed is, so that runs with different seeds are scored on the
# same examples.
EVAL_SEED = 0


class Datasets(NamedTuple):
  """What `build_datasets` returns; token counts are over all processes."""

  tokenizer: tokenizer_lib.Tokenizer
  train_iterator: Optional[loaders.BatchIterator]  # None for evaluation only
  eval_batches: List[packed_batches.Batch]
  train_tokens: int  # non-padding tokens (bos/eos included) of the train split
  eval_tokens: int  # same for the evaluation split, all of it
  train_sequences: int
  eval_sequences: int
  train_token_counts: np.ndarray  # [vocab_size] occurrences of each id in the train split

  @property
  def tokenizer_sha256(self) -> Optional[str]:
    """sha256 of WORKDIR/tokenizer.model, None for bytes: checkpoints keep it."""
    return self.tokenizer.sha256


@contextlib.contextmanager
def _run_tokenizer(config, workdir: str) -> Iterator[tokenizer_lib.Tokenizer]:
  """Checks the data fields and that the eval split exists, then yields the
  run's tokenizer (trained on a bounded sample of the training split the first
  time, and kept in the workdir only if the block succeeds)."""
  data = config.data
  for field in ('train_split', 'eval_split'):
    if not getattr(data, field):
      raise ConfigError(
          f'config.data.{field}={getattr(data, field)!r} is not allowed; name a '
          "split, e.g. 'train' or 'validation'."
      )
  sources.source_of(data)  # an unknown source fails here, listing the known ones
  sample = data.tokenizer_sample_chars
  tokens = tokenizer_files.vocab_size_of(data)  # known before a tokenizer is trained
  model_vocab = config.model.vocab_size
  if model_vocab is not None and model_vocab != tokens:
    raise ConfigError(
        f"config.model.vocab_size={model_vocab} does not match the tokenizer's "
        f'{tokens} tokens; set config.data.vocab_size={tokens} '
        '(config.model.vocab_size follows it).'
    )
  # Fails on a missing eval split now, not after the tokenizer and the
  # training split are done (the training split is read to train first).
  if next(units.split_units(data, data.eval_split), None) is None:
    raise ConfigError(
        f'Split {data.eval_split!r} holds no documents; check config.data.eval_split '
        'and config.data.source.'
    )
  with tokenizer_files.workdir_tokenizer(
      data,
      workdir,
      lambda: units.sample_documents(data, data.train_split, sample),
      pretrained_model=_pretrained_tokenizer(config),
  ) as tokenizer:
    yield tokenizer


def _pretrained_tokenizer(config) -> Optional[str]:
  """The tokenizer file of run config.init_from, if it has one of the
  configured kind: a run that starts from another's parameters reads text
  with the same token ids."""
  filename = tokenizer_lib.FILENAMES.get(config.data.tokenizer)
  if not filename or not config.init_from:
    return None
  path = pathlib.Path(config.init_from) / filename
  return str(path) if path.exists() else None


def prepare_splits(
    config, workdir: str, *, part_index: int = 0, part_count: int = 1, tokenizer_only: bool = False
) -> Dict[str, Any]:
  """Prepares part `part_index` of `part_count` of the train and eval splits.

  Returns a summary: per split its folder, this part's sequences, tokens and
  shards, and whether every part is there yet. A tokenizer trained here is
  kept in `workdir` once the splits are prepared (at once with
  `tokenizer_only`). A `workdir` that is a file is refused, whatever the
  tokenizer.
  """
  part_count = loaders.check_int('--part_count', part_count, 1)
  part_index = loaders.check_int('--part_index', part_index, 0, part_count - 1)
  seq_len = loaders.check_int('config.model.max_len', config.model.max_len, 3)
  storage.check_folder(workdir, writable=False)
  with _run_tokenizer(config, workdir) as tokenizer:
    summary: Dict[str, Any] = {'tokenizer': tokenizer.fingerprint}
    if not tokenizer_only:
      summary.update(_prepare_parts(config, tokenizer, seq_len, part_index, part_count))
    return summary


def _prepare_parts(
    config, tokenizer: tokenizer_lib.Tokenizer, seq_len: int, part_index: int, part_count: int
) -> Dict[str, Any]:
  """`prepare_splits`'s summary of each split."""
  summary = {}
  for split in dict.fromkeys((config.data.train_split, config.data.eval_split)):
    signature = prepare.split_signature(config.data, split, tokenizer, seq_len)
    folder = prepare.split_folder(config.data, split, signature)
    remote = remote_splits.remote_folder(config.data, split)
    if remote:
      remote_splits.download(remote, folder)
    with prepare.preparing(folder, part_index, part_count):
      manifest = prepare.prepare_part(
          config.data,
          split,
          folder,
          tokenizer=tokenizer,
          seq_len=seq_len,
          signature=signature,
          workers=prepare.workers_of(config.data),
          sequences_per_shard=config.data.sequences_per_shard,
          part_index=part_index,
          part_count=part_count,
      )
    if remote:
      remote_splits.upload(folder, remote)
    try:
      shards.PreparedSplit(folder, signature)
      all_parts = True
    except ConfigError:
      all_parts = False
    summary[split] = {
        'folder': str(folder),
        'sequences': manifest['sequences'],
        'tokens': manifest['tokens'],
        'shards': len(manifest['shards']),
        'all_parts_prepared': all_parts,
    }
  return summary


def build_datasets(
    config,
    workdir: str,
    make_transform: Callable[[tokenizer_lib.Tokenizer], packed_batches.Transform],
    process_index: int = 0,
    process_count: int = 1,
    train: bool = True,
) -> Datasets:
  """Tokenizer, training iterator and evaluation batches of a run's config.

  `config` is the run's `RunConfig` (training/run_config.py): it reads
  config.loop's seed, batch_size and eval_batch_size (global; divided among
  the processes), config.model.max_len and config.data. The tokenizer lives in
  `workdir`; the splits are prepared as ArrayRecord shards (`prepare`) under
  config.data.prepared_dir or the cache the first time, and read from them with
  random access. Without `train` (evaluation only), `train_iterator` is None.
  A tokenizer trained here is kept in `workdir` only once all of this
  succeeded, so a run refused for its data leaves none behind.
  `make_transform(tokenizer)` gives the transform that makes each example of
  a row.
  """
  seq_len = loaders.check_int('config.model.max_len', config.model.max_len, 3)
  with _run_tokenizer(config, workdir) as tokenizer:
    transform = make_transform(tokenizer)
    return _datasets(config, tokenizer, seq_len, process_index, process_count, train, transform)


def _datasets(
    config,
    tokenizer: tokenizer_lib.Tokenizer,
    seq_len: int,
    process_index: int,
    process_count: int,
    train: bool,
    transform: packed_batches.Transform,
) -> Datasets:
  """`build_datasets` once the tokenizer and the transform are known."""
  data = config.data
  batch_size, eval_batch_size = loaders.per_process_batch_sizes(config.loop, process_count)
  # Process 0 prepares what is missing (the others wait for it); everyone
  # then reads only the shards' footers and manifests, whatever their size.
  train_prepared, eval_prepared = (
      prepare.prepared_split(
          data, split, tokenizer=tokenizer, seq_len=seq_len, prepare=process_index == 0
      )
      for split in (data.train_split, data.eval_split)
  )
  train_split = shards.ShardedSequences(train_prepared, seq_len)
  evaluation = shards.ShardedSequences(eval_prepared, seq_len)
  train_iterator = None
  if train:
    train_iterator = packed_batches.create_train_iterator(
        train_split,
        loaders.LoaderSettings.of_process(
            data,
            batch_size=batch_size,
            seed=config.loop.seed,
            process_index=process_index,
            process_count=process_count,
        ),
        transform,
    )
  eval_batches = packed_batches.create_eval_batches(
      evaluation,
      batch_size=eval_batch_size,
      seed=EVAL_SEED,
      transform=transform,
      pad_id=tokenizer.pad_id,
      max_batches=data.max_eval_batches or None,
      process_index=process_index,
      process_count=process_count,
  )
  return Datasets(
      tokenizer=tokenizer,
      train_iterator=train_iterator,
      eval_batches=eval_batches,
      train_tokens=train_prepared.tokens,
      eval_tokens=eval_prepared.tokens,
      train_sequences=train_prepared.sequences,
      eval_sequences=eval_prepared.sequences,
      train_token_counts=train_prepared.unigram_counts,
  )
