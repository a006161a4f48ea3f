"""What a pretrained encoder's `<s>` token knows about a sentence, layer by layer.

The library of `python -m linformer_jax.pooling_probe`. For the encoder of a
pretraining run (`config.init_from`) and a classification dataset, it reads
every layer's output on training and evaluation examples and reports, per
layer:

* **linear probes**: the evaluation accuracy of a logistic regression (L2,
  standardised features) trained on the frozen `<s>` vector (`first`) and on
  the mean of the real tokens' vectors (`mean`);
* **the `<s>` query's attention**: its entropy H over what it attends to (the
  real tokens for full attention; the k compressed slots for Linformer), as
  exp(H), the effective number of keys, and the share of the largest weight,
  averaged over heads and examples.

If `first` probes fall behind `mean` probes for Linformer but not for the
Transformer, and the Linformer `<s>` spreads its attention over its slots,
first-token pooling loses what mean pooling keeps.
"""

import dataclasses
import os
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from linformer_jax.analysis import spectrum
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.training import run_builder
from linformer_jax.training.checkpoints import CheckpointStore


@dataclasses.dataclass
class Features:
  """Per layer, the pooled vectors of a set of examples and their labels."""

  first: List[np.ndarray]  # per layer [examples, d]
  mean: List[np.ndarray]
  labels: np.ndarray
  entropy: List[np.ndarray]  # per layer [examples]: mean over heads, nats
  largest: List[np.ndarray]  # per layer [examples]: largest <s> weight, mean over heads


def _capture(module: Any, method_name: str) -> bool:
  return spectrum.capture_intermediates(module, method_name) or (
      method_name == '__call__' and isinstance(module, models.EncoderLayer)
  )


def _encoder_step(config):
  encoder = models.Encoder(config, name='encoder')

  def step(variables, inputs, padding_mask, segments):
    _, state = encoder.apply(
        variables,
        inputs,
        padding_mask,
        segments=segments,
        deterministic=True,
        capture_intermediates=_capture,
        mutable=['intermediates'],
    )
    captured = {'encoder': state['intermediates']}
    hidden = [captured['encoder'][f'layers_{i}']['__call__'][0] for i in range(config.num_layers)]
    return hidden, spectrum.context_queries_and_keys(captured, config, padding_mask)

  return jax.jit(step)


def _pooled_features(step, variables, batches, config) -> Features:
  layers = range(config.num_layers)
  out = Features(
      [[] for _ in layers], [[] for _ in layers], [], [[] for _ in layers], [[] for _ in layers]
  )
  labels = []
  for batch in batches:
    real = np.asarray(batch.get('weights', np.ones(len(batch['labels'])))) > 0
    mask = jnp.asarray(batch['padding_mask'])
    segments = batch.get('segments') if config.num_segments else None
    hidden, queries_and_keys = step(variables, jnp.asarray(batch['inputs']), mask, segments)
    for layer in layers:
      h = hidden[layer]
      out.first[layer].append(np.asarray(h[:, 0], np.float64)[real])
      out.mean[layer].append(np.asarray(models.mean_pool(h, mask), np.float64)[real])
      q, keys, key_mask = queries_and_keys[layer]
      p = spectrum.attention_matrix(np.asarray(q)[:, :1], np.asarray(keys), key_mask)[:, :, 0]
      logs = np.log(np.where(p > 0, p, 1.0))
      out.entropy[layer].append((-(p * logs).sum(-1)).mean(-1)[real])
      out.largest[layer].append(p.max(-1).mean(-1)[real])
    labels.append(np.asarray(batch['labels'])[real])
  join = lambda parts: [np.concatenate(per_layer) for per_layer in parts]  # noqa: E731
  return Features(
      join(out.first), join(out.mean), np.concatenate(labels), join(out.entropy), join(out.largest)
  )


def probe_accuracy(
    train_x: np.ndarray,
    train_y: np.ndarray,
    eval_x: np.ndarray,
    eval_y: np.ndarray,
    num_classes: int,
    *,
    l2: float = 1e-3,
    steps: int = 500,
) -> float:
  """The evaluation accuracy of an L2 logistic regression on standardised
  features, fitted by full-batch Adam."""
  center, scale = train_x.mean(0), train_x.std(0) + 1e-6
  train_x = jnp.asarray((train_x - center) / scale, jnp.float32)
  eval_x = jnp.asarray((eval_x - center) / scale, jnp.float32)
  params = {'w': jnp.zeros((train_x.shape[1], num_classes)), 'b': jnp.zeros(num_classes)}
  optimizer = optax.adam(0.05)

  def loss(params):
    logits = train_x @ params['w'] + params['b']
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), train_y[:, None], 1).mean()
    return nll + l2 * jnp.sum(params['w'] ** 2)

  @jax.jit
  def update(params, state):
    grads = jax.grad(loss)(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state

  state = optimizer.init(params)
  for _ in range(steps):
    params, state = update(params, state)
  predictions = np.asarray(jnp.argmax(eval_x @ params['w'] + params['b'], -1))
  return float(np.mean(predictions == eval_y))


def _take(iterator, count: int) -> List[Dict[str, np.ndarray]]:
  return [next(iterator) for _ in range(count)]


def probe(config: ml_collections.ConfigDict, workdir: str, *, train_batches: int = 64) -> Dict:
  """The probe report of config.init_from's encoder on config's data (see
  module doc); `workdir` receives the tokenizer the data needs.

  Raises:
    ConfigError: no init_from, a run of another model, or bad data.
  """
  if config.get('task') != 'classification' or not config.init_from:
    raise ConfigError(
        'pooling_probe needs a classification config with config.init_from set to a '
        'pretraining run, e.g. configs/finetune_sst2.py --config.init_from=runs/gutenberg.'
    )
  if train_batches < 1:
    raise ConfigError(f'--train_batches={train_batches}: use a positive number.')
  parts = run_builder.build_parts(config)
  parts.task.check_init_from(config)
  data = parts.build_data(workdir)
  abstract = parts.abstract_variables()
  subtrees = {('params', 'encoder'): abstract['params']['encoder']}
  for collection, variables in abstract.items():
    if collection != 'params' and 'encoder' in variables:
      subtrees[('constants', collection, 'encoder')] = variables['encoder']
  restored = CheckpointStore.restore_subtrees(config.init_from, subtrees)
  variables = {'params': restored[('params', 'encoder')]}
  for path, value in restored.items():
    if path[0] == 'constants':
      variables[path[1]] = value
  model_config = parts.model_config
  step = _encoder_step(model_config)
  train = _pooled_features(step, variables, _take(data.train_iterator, train_batches), model_config)
  evaluation = _pooled_features(step, variables, data.eval_batches, model_config)
  num_classes = len(config.data.labels)
  layers = []
  for layer in range(model_config.num_layers):
    row: Dict[str, Any] = {'layer': layer + 1}
    for pooling in ('first', 'mean'):
      row[f'probe_{pooling}'] = probe_accuracy(
          getattr(train, pooling)[layer],
          train.labels,
          getattr(evaluation, pooling)[layer],
          evaluation.labels,
          num_classes,
      )
    entropy = evaluation.entropy[layer]
    row['s_entropy_nats'] = float(entropy.mean())
    row['s_effective_keys'] = float(np.exp(entropy).mean())
    row['s_largest_weight'] = float(evaluation.largest[layer].mean())
    layers.append(row)
  counts = np.bincount(evaluation.labels, minlength=num_classes)
  real_tokens = float(np.mean([b['padding_mask'].sum(1).mean() for b in data.eval_batches]))
  return {
      'init_from': os.path.abspath(config.init_from),
      'attention': model_config.attention,
      'n': model_config.max_len,
      'k': model_config.projected_len if model_config.attention != 'full' else None,
      'eval_split': config.data.eval_split,
      'train_examples': int(len(train.labels)),
      'eval_examples': int(len(evaluation.labels)),
      'eval_majority_accuracy': float(counts.max() / counts.sum()),
      'mean_real_tokens': real_tokens,
      'layers': layers,
  }


def summary_lines(report: Dict[str, Any]) -> List[str]:
  """One line per layer: the probes and the <s> attention."""
  lines = []
  for row in report['layers']:
    lines.append(
        f"layer {row['layer']}: probe first {row['probe_first']:.3f}, mean {row['probe_mean']:.3f}"
        f"; <s> attention entropy {row['s_entropy_nats']:.2f} nats "
        f"({row['s_effective_keys']:.1f} effective keys, largest weight "
        f"{row['s_largest_weight']:.2f})"
    )
  return lines
