"""What a pretrained encoder's `<s>` token knows about a sentence, layer by layer.

  python -m linformer_jax.pooling_probe --config configs/finetune_sst2.py \
      --config.init_from=runs/gutenberg --workdir runs/probe_linformer
  python -m linformer_jax.pooling_probe --config configs/finetune_sst2.py \
      --config.init_from=runs/gutenberg_transformer --config.model.attention=full \
      --workdir runs/probe_transformer

For the frozen encoder of a pretraining run (`config.init_from`) on a
classification dataset, it reports per layer: the evaluation accuracy of linear
probes on the `<s>` vector (`first`) and on the mean of the real tokens' vectors
(`mean`); the entropy H of the `<s>` query's attention, exp(H) (its effective
number of keys) and its largest weight; the sum and negative share of each real
token's weight in the `<s>` output (P, or P F for a Linformer's matrix F; a mean
has weights that sum to 1, none negative); and how many real tokens each slot of
F mixes, a participation ratio. It writes WORKDIR/probe.json (and the tokenizer
the data needs) and prints one line per layer. docs/results_parity.md describes
the measures and what they found.
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_capture
from linformer_jax.model import layers
from linformer_jax.model import models
from linformer_jax.settings_flags import setting
from linformer_jax.training import fine_tuning
from linformer_jax.training import run_builder


def _capture(module: Any, method_name: str) -> bool:
  return attention_capture.capture_intermediates(module, method_name) or (
      method_name == '__call__' and isinstance(module, layers.EncoderLayer)
  )


def _value_matrices(encoder: Any, config) -> List[Any]:
  """Per layer the value projection F ([n, k] or [heads, n, k]) of a Linformer with a
  matrix projection (weights [n, k]); None for full attention and other projections."""
  kind = config.projection_kind
  if not config.attention_kind.uses_projection or not (kind.has_weights and kind.weight_ndim == 2):
    return [None] * config.num_layers
  if config.sharing == 'layerwise':
    return [encoder['shared_projection']['__call__'][0][1]] * config.num_layers
  return [
      encoder[f'layers_{layer}']['attention']['projection']['__call__'][0][1]
      for layer in range(config.num_layers)
  ]


def token_weights(p_first: np.ndarray, value_matrix: Optional[Any], mask: np.ndarray) -> np.ndarray:
  """The weight of each real token in the `<s>` output, [batch, heads, length]
  (NaN for Linformer projections that are not a matrix).

  With full attention it is the `<s>` row of P. A Linformer's output is
  P (F^T V), so token j gets sum_i P[i] F[j, i]: weights that need not be
  positive nor sum to one.
  """
  mask = np.asarray(mask, np.float64)
  if value_matrix is None:
    if p_first.shape[-1] != mask.shape[1]:  # Pooling or convolution: not a matrix.
      return np.full(p_first.shape[:2] + mask.shape[1:], np.nan)
    return p_first * mask[:, None, :]
  f = np.asarray(value_matrix, np.float64)[..., : mask.shape[1], :]  # [(heads,) length, k]
  equation = 'bhk,nk->bhn' if f.ndim == 2 else 'bhk,hnk->bhn'
  return np.einsum(equation, p_first, f) * mask[:, None, :]


def slot_positions(value_matrix: Optional[Any], mask: np.ndarray) -> np.ndarray:
  """How many real tokens each slot of F mixes, per example [batch]: the
  participation ratio of each slot's weights over the example's real
  positions, averaged over slots (and heads); NaN without a matrix F."""
  mask = np.asarray(mask, np.float64)
  if value_matrix is None:
    return np.full(mask.shape[0], np.nan)
  f = np.asarray(value_matrix, np.float64)
  f = f[None] if f.ndim == 2 else f  # [heads, n, k]
  squares = f[:, None, : mask.shape[1]] ** 2 * mask[None, :, :, None]  # [heads, batch, len, k]
  ratio = squares.sum(2) ** 2 / np.maximum((squares**2).sum(2), 1e-300)
  return ratio.mean(axis=(0, 2))


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
    return (
        hidden,
        attention_capture.context_queries_and_keys(captured, config, padding_mask),
        _value_matrices(captured['encoder'], config),
    )

  return jax.jit(step)


def _pooled_features(
    step, variables, batches, config
) -> Tuple[Dict[str, List[np.ndarray]], np.ndarray]:
  """Per layer, the pooled vectors [examples, d] of the examples with a weight
  and [examples] measures of what `<s>` reads (each a mean over heads); and
  their labels."""
  parts: Dict[str, List[List[np.ndarray]]] = {}
  labels = []
  for batch in batches:
    real = np.asarray(batch.get('weights', np.ones(len(batch['labels'])))) > 0
    host_mask = np.asarray(batch['padding_mask'])
    mask = jnp.asarray(host_mask)
    segments = batch.get('segments') if config.num_segments else None
    hidden, queries_and_keys, values = step(variables, jnp.asarray(batch['inputs']), mask, segments)
    for layer, h in enumerate(hidden):
      q, keys, key_mask = queries_and_keys[layer]
      first_query = np.asarray(q)[:, :1]
      p = attention_capture.attention_matrix(first_query, np.asarray(keys), key_mask)[:, :, 0]
      logs = np.log(np.where(p > 0, p, 1.0))
      w = token_weights(p, values[layer], host_mask)
      negative = np.where(w < 0, -w, 0.0).sum(-1) / np.maximum(np.abs(w).sum(-1), 1e-30)
      entropy = (-(p * logs).sum(-1)).mean(-1)  # nats
      found = {
          'first': np.asarray(h[:, 0], np.float64),
          'mean': np.asarray(models.mean_pool(h, mask), np.float64),
          # Each report row's mean: <s>'s attention and its token weights.
          's_entropy_nats': entropy,
          's_effective_keys': np.exp(entropy),
          's_largest_weight': p.max(-1).mean(-1),
          's_token_weight_sum': w.sum(-1).mean(-1),
          's_negative_token_weight_share': negative.mean(-1),
          'slot_positions': slot_positions(values[layer], host_mask),
      }
      for name, value in found.items():
        parts.setdefault(name, [[] for _ in range(config.num_layers)])[layer].append(value[real])
    labels.append(np.asarray(batch['labels'])[real])
  joined = {
      name: [np.concatenate(chunks) for chunks in per_layer] for name, per_layer in parts.items()
  }
  return joined, np.concatenate(labels)


def probe_accuracy(
    train_x: np.ndarray,
    train_y: np.ndarray,
    eval_x: np.ndarray,
    eval_y: np.ndarray,
    num_classes: int,
) -> float:
  """The evaluation accuracy of a logistic regression (L2 penalty 1e-3) on
  standardised features, fitted by 500 steps of full-batch Adam."""
  center, scale = train_x.mean(0), train_x.std(0) + 1e-6
  train_x = jnp.asarray((train_x - center) / scale, jnp.float32)
  eval_x = jnp.asarray((eval_x - center) / scale, jnp.float32)
  params = {'w': jnp.zeros((train_x.shape[1], num_classes)), 'b': jnp.zeros(num_classes)}
  optimizer = optax.adam(0.05)

  def loss(params):
    logits = train_x @ params['w'] + params['b']
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), train_y[:, None], 1).mean()
    return nll + 1e-3 * jnp.sum(params['w'] ** 2)

  @jax.jit
  def update(params, state):
    grads = jax.grad(loss)(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state

  state = optimizer.init(params)
  for _ in range(500):
    params, state = update(params, state)
  predictions = np.asarray(jnp.argmax(eval_x @ params['w'] + params['b'], -1))
  return float(np.mean(predictions == eval_y))


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
  train_batches: int = setting(64, 'Training batches the probes are fitted on.')


def probe(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    train_batches: int = ProbeSettings.train_batches,
) -> Dict:
  """The probe report of config.init_from's encoder on config's data (see module doc);
  `workdir` receives the tokenizer the data needs. ConfigError: no init_from, a run of
  another model, or bad data."""
  if config.task != 'classification' or not config.init_from:
    raise ConfigError(
        'pooling_probe needs a classification config with config.init_from set to a '
        'pretraining run, e.g. configs/finetune_sst2.py --config.init_from=runs/gutenberg.'
    )
  if train_batches < 1:
    raise ConfigError(f'--train_batches={train_batches}: use a positive number.')
  parts = run_builder.build_parts(config)
  parts.model_config.require_unscanned('pooling_probe')
  attention_capture.require_plain_softmax(parts.model_config, 'pooling_probe')
  parts.task.check_init_from(parts.settings)
  data = parts.build_data(workdir)
  abstract = dict(parts.abstract_variables())
  encoder_params = abstract.pop('params')['encoder']
  params, constants = fine_tuning.restore_encoder(config.init_from, encoder_params, abstract)
  variables = {'params': params, **constants}
  model_config = parts.model_config
  step = _encoder_step(model_config)
  train_data = [next(data.train_iterator) for _ in range(train_batches)]
  train, train_labels = _pooled_features(step, variables, train_data, model_config)
  evaluation, eval_labels = _pooled_features(step, variables, data.eval_batches, model_config)
  num_classes = len(config.data.labels)
  layers = []
  for layer in range(model_config.num_layers):
    row: Dict[str, Any] = {'layer': layer + 1}
    for pooling in ('first', 'mean'):
      row[f'probe_{pooling}'] = probe_accuracy(
          train[pooling][layer], train_labels, evaluation[pooling][layer], eval_labels, num_classes
      )
    row.update({name: float(v[layer].mean()) for name, v in evaluation.items() if name[:2] == 's_'})
    slots = evaluation['slot_positions'][layer]
    row['real_tokens_per_slot'] = None if np.isnan(slots).all() else float(slots.mean())
    layers.append(row)
  counts = np.bincount(eval_labels, minlength=num_classes)
  real_tokens = float(np.mean([b['padding_mask'].sum(1).mean() for b in data.eval_batches]))
  return {
      'init_from': os.path.abspath(config.init_from),
      'attention': model_config.attention,
      'n': model_config.max_len,
      'k': model_config.projected_len if model_config.attention != 'full' else None,
      'eval_split': config.data.eval_split,
      'train_examples': int(len(train_labels)),
      'eval_examples': int(len(eval_labels)),
      'eval_majority_accuracy': float(counts.max() / counts.sum()),
      'mean_real_tokens': real_tokens,
      'layers': layers,
  }


def summary_lines(report: Dict[str, Any]) -> List[str]:
  """One line per layer: the probes and the <s> attention."""
  lines = []
  for row in report['layers']:
    slots = row.get('real_tokens_per_slot')
    lines.append(
        f"layer {row['layer']}: probe first {row['probe_first']:.3f}, mean {row['probe_mean']:.3f}"
        f"; <s> attention entropy {row['s_entropy_nats']:.2f} nats "
        f"({row['s_effective_keys']:.1f} effective keys, largest weight "
        f"{row['s_largest_weight']:.2f}); its token weights sum to "
        f"{row['s_token_weight_sum']:.3f}, {row['s_negative_token_weight_share']:.0%} negative"
        + ('' if slots is None else f'; each slot mixes {slots:.1f} real tokens')
    )
  return lines


def define_flags() -> None:
  cli.define_config_flags()
  settings_flags.define_flags(ProbeSettings)


def main(_):
  parsed = flags.FLAGS
  settings = settings_flags.from_flags(ProbeSettings)
  report = probe(parsed.config, parsed.workdir, train_batches=settings.train_batches)
  workdir = storage.location(parsed.workdir)
  storage.makedirs(workdir)
  path = os.path.join(workdir, 'probe.json')
  storage.write_text(path, json.dumps(report, indent=2))
  print(
      f"{report['attention']} encoder of {report['init_from']}: {report['train_examples']} "
      f"training and {report['eval_examples']} {report['eval_split']} examples "
      f"(majority class {report['eval_majority_accuracy']:.3f})",
      flush=True,
  )
  print(*summary_lines(report), sep='\n', flush=True)
  print(f'results in {path}', flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
