"""A classification dataset of one's own: which of two letters a string holds more of.

Naming this file in config.extensions registers the source as
config.data.source='more_letters' for config.task='classification', with a
setting of its own, config.data.letters_per_example (an odd number):

  python -m linformer_jax.train --config configs/lra_text.py --workdir /tmp/letters \
      --config.extensions="('docs/examples/more_letters_source.py',)" \
      --config.data.source=more_letters --config.data.letters_per_example=9 \
      --config.total_steps=200

The run's tokenizer (configs/lra_text.py: bytes) encodes the texts, as for the
built-in 'tsv' and 'tfds' sources (docs/data.md).
"""

import numpy as np

from linformer_jax import registry
from linformer_jax.data import labelled_examples
from linformer_jax.data.classification_sources import base

SPLIT_SEEDS = {'train': 0, 'validation': 1}


@base.REGISTRY.register('more_letters')
class MoreLetters(base.ClassificationSource):
  """Which of two letters a string holds more of."""

  settings = (
      registry.Setting(
          'letters_per_example',
          int,
          7,
          check=lambda n: n % 2 == 1,
          allowed='use an odd number',
          help_text='letters in each example string',
      ),
  )

  def examples(self, data_config, split):
    length = self.setting(data_config, 'letters_per_example')
    bits = np.random.default_rng(SPLIT_SEEDS[split]).integers(0, 2, (48, length))
    texts = [(' '.join('ab'[bit] for bit in row),) for row in bits]
    return labelled_examples.Examples(texts, (2 * bits.sum(1) > length).astype(np.int32))
