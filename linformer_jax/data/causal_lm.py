"""Next-token (causal language modelling) input pipeline.

The per-sequence transform of the pretraining pipeline (`pretraining`) for a
left-to-right model; `masked_lm` is its sibling. It shares with masked-LM
pretraining the tokenizer in the workdir, the prepared splits packed into rows
of n = config.model.max_len tokens (`[bos] chunk [eos]`, see `packing`), the
shuffling, process shards and resumable iterator state. config.data.mask_rate
is not read.

Every sequence is read left to right: position t is trained to predict token
t + 1 from tokens 0..t, so the model must be causal (a bidirectional encoder
would see its targets). Context does not cross rows: a row's first text token
is predicted from bos alone.

Every batch is a dict of numpy arrays of shape [batch, n], with the keys and
dtypes of the masked-LM batches:
  inputs        int32, the packed row
  targets       int32, the row shifted left by one (targets[t] = inputs[t + 1];
                the last position holds the pad id)
  weights       float32, 1.0 where positions t and t + 1 are both real tokens,
                else 0.0: bos predicts the first text token, the last text
                token predicts eos, and eos and padding predict nothing
  padding_mask  bool, True for real tokens (bos and eos included)
Evaluation fills its last batch with all-padding rows of weight 0.
"""

import grain
import numpy as np

from linformer_jax.data import packed_batches
from linformer_jax.data import pretraining

Batch = packed_batches.Batch


class NextTokenTargets(grain.transforms.Map):
  """The next-token example (a Batch of [n] arrays) of one packed row [n].

  Deterministic: a row gives the same example every epoch, whatever the seed.
  """

  def __init__(self, pad_id: int):
    self._pad_id = int(pad_id)

  def map(self, element: np.ndarray) -> Batch:
    inputs = np.asarray(element, np.int32)
    real = inputs != self._pad_id
    targets = np.full_like(inputs, self._pad_id)
    targets[:-1] = inputs[1:]
    weights = np.zeros(inputs.shape, np.float32)
    weights[:-1] = real[:-1] & real[1:]
    return {'inputs': inputs, 'targets': targets, 'weights': weights, 'padding_mask': real}


def build_datasets(
    config, workdir: str, process_index: int = 0, process_count: int = 1, train: bool = True
) -> pretraining.Datasets:
  """Tokenizer, training iterator and evaluation batches of a run's config.

  As `masked_lm.build_datasets` (same fields read, same prepared splits, same
  tokenizer in `workdir`), with next-token examples instead of masked ones.
  """
  return pretraining.build_datasets(
      config,
      workdir,
      lambda tokenizer: NextTokenTargets(tokenizer.pad_id),
      process_index=process_index,
      process_count=process_count,
      train=train,
  )
