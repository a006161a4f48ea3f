"""A task of one's own: tell whether a text's tokens were shuffled.

Each packed row of the pretraining data (any source: config.data.source)
becomes one example. Half the time, drawn anew every epoch, the tokens between
its bos and its last real token are put in a random order; the encoder, with
a classification head, learns to say which rows were shuffled. It probes
whether a model sees word order, which attention over a projected sequence
(config.model.projected_len) might blur. Naming this file in config.extensions
registers it as config.task='shuffled_text' for every command:

  python -m linformer_jax.train --config configs/tiny.py --workdir /tmp/shuffled \
      --config.extensions="('docs/examples/shuffled_text_task.py',)" \
      --config.task=shuffled_text

The closing line compares the accuracy with always answering "kept" (about
50%).
"""

import grain
import jax.numpy as jnp
import numpy as np

from linformer_jax.data import packed_batches
from linformer_jax.data import pretraining
from linformer_jax.model import models
from linformer_jax.training import tasks

# The share of rows whose tokens are shuffled.
SHUFFLED_SHARE = 0.5
# Labels: 0 = the row as written, 1 = its tokens shuffled.
KEPT, SHUFFLED = 0, 1


class ShuffleSome(grain.transforms.RandomMap):
  """One classification example of a packed row [n]: the row, shuffled or not,
  and its label. A grain `RandomMap`, so the choice is reproducible from the
  seed and the row's position in the stream."""

  def __init__(self, pad_id: int):
    self._pad_id = int(pad_id)

  def random_map(self, element: np.ndarray, rng: np.random.Generator) -> packed_batches.Batch:
    inputs = np.array(element, np.int32)
    real = inputs != self._pad_id
    shuffled = rng.random() < SHUFFLED_SHARE
    # bos stays first and the last real token (eos) stays last: only the
    # order of the text between them tells the classes apart.
    last = int(real.sum()) - 1
    if shuffled and last > 1:
      inputs[1:last] = rng.permutation(inputs[1:last])
    return {
        'inputs': inputs,
        'padding_mask': real,
        'segments': np.zeros_like(inputs),
        'labels': np.int32(SHUFFLED if shuffled else KEPT),
        'weights': np.float32(1.0),
    }


@tasks.TASKS.register('shuffled_text')
class ShuffledText(tasks.Classification):
  """Shuffled or kept: a two-class task on the pretraining rows. The loss,
  metrics and fine-tuning from config.init_from are classification's."""

  name = 'shuffled_text'

  def build_data(self, config, workdir, *, process_index, process_count, train):
    # The pretraining pipeline (tokenizer, prepared shards, shuffling, process
    # shards, resumable iterator) with this task's transform.
    return pretraining.build_datasets(
        config,
        workdir,
        lambda tokenizer: ShuffleSome(tokenizer.pad_id),
        process_index=process_index,
        process_count=process_count,
        train=train,
    )

  def create_model(self, config):
    return models.SequenceClassifier(config.model, num_classes=2)

  def batch_shapes(self, config):
    rows = (config.loop.batch_size, config.model.max_len)
    return {
        'inputs': (rows, jnp.int32),
        'padding_mask': (rows, jnp.bool_),
        'segments': (rows, jnp.int32),
        'labels': ((config.loop.batch_size,), jnp.int32),
        'weights': ((config.loop.batch_size,), jnp.float32),
    }

  def reference_results(self, data):
    # Always answering "kept": the accuracy a model blind to order gets.
    always_kept = np.zeros([2])
    always_kept[KEPT] = 1
    return {'kept_accuracy': tasks.majority_accuracy(always_kept, data.eval_batches)}

  def summary(self, results):
    return (
        f'{results["eval_split"]} accuracy {results["eval_accuracy"]:.2%} after '
        f'{results["step"]} steps (always "kept": {results["kept_accuracy"]:.2%})'
    )
