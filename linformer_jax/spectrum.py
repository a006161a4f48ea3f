"""The spectrum of the context-mapping matrix P, the Linformer paper's Figure 1.

  python -m linformer_jax.spectrum --config configs/default.py \
      --workdir runs/default --out runs/default/spectrum \
      --num_sequences=64 --index=128

For every layer and head of a trained masked-LM run's checkpoint, it averages
over evaluation sequences the normalised cumulative singular values cumsum(s) /
sum(s) of P = softmax(Q K^T / sqrt(d)): n x n for full attention, n x k for
Linformer (over the keys the model compresses); for another attention kind, the
P its `attention_weights` gives (the matrix whose product with the values is its
attention). It writes spectrum.json (per layer and head the curve and its value
at --index), cumulative_singular_values.png and heatmap.png to --out, and prints
one line per layer (docs/results_gutenberg.md).

Padded positions are left out: their rows and columns of P only add zero singular
values, so a sequence's curve is that of its n_real x n_real (n_real x k) matrix,
at 1 from index n_real on.

`random_projection_errors` measures the paper's Theorem 1, the random projection
of P V that the low rank of P allows (the notebook's section 1).
"""

import dataclasses
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from absl import flags
import jax
import ml_collections
import numpy as np

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.analysis.tables import new_axes
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_capture
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting
from linformer_jax.training import run_loading

SPECTRUM_FILE = 'spectrum.json'
CURVES_PLOT = 'cumulative_singular_values.png'
HEATMAP_PLOT = 'heatmap.png'
# Decimals kept in spectrum.json; rounding keeps curves monotone and ending at 1.
_DECIMALS = 6


def normalised_cumulative_singular_values(p: np.ndarray) -> np.ndarray:
  """cumsum(s) / sum(s) of the singular values s of p [..., rows, columns], largest first.

  Returns float64 [..., min(rows, columns)], entry i - 1 the share of the i largest:
  non-decreasing, in [0, 1], ending at 1. A matrix of all zeros is a ValueError.
  """
  singular_values = np.linalg.svd(np.asarray(p, np.float64), compute_uv=False)
  cumulative = np.cumsum(singular_values, axis=-1)
  total = cumulative[..., -1:]
  if np.any(total <= 0):
    raise ValueError('A matrix of all zeros has no normalised spectrum.')
  return cumulative / total


def random_projection_errors(
    p: np.ndarray,
    values: np.ndarray,
    projected_lens: Sequence[int],
    *,
    draws: int = 16,
    seed: int = 0,
) -> np.ndarray:
  """The paper's Theorem 1, measured: ||P R^T R V - P V|| / ||P V|| for a random R.

  R is [k, n] with i.i.d. N(0, 1/k) entries, one draw shared by every matrix of
  the stack, applied after the softmax (the Linformer's E sits inside it). For
  Gaussian R the expected squared error is exactly
  (||P V||^2 + sum_i ||P_i||^2 ||V_i||^2) / (k ||P V||^2), over the matrices i of the
  stack, in Frobenius norms: for given P and V the error falls as 1/sqrt(k).

  Args:
    p: [..., n, n] context-mapping matrices, each row summing to 1.
    values: [..., n, head_dim] the values V, stacked as p.
    projected_lens: the k to measure.
    draws: how many R are drawn for each k.
    seed: numpy seed of the draws.

  Returns:
    float64 [len(projected_lens)]: per k, the root mean square over the draws of
    the relative error in Frobenius norm.
  """
  p = np.asarray(p, np.float64)
  values = np.asarray(values, np.float64)
  exact = p @ values
  exact_norm = np.linalg.norm(exact)
  rng = np.random.default_rng(seed)
  errors = []
  for projected_len in projected_lens:
    squared = []
    for _ in range(draws):
      r = rng.normal(0.0, 1.0 / np.sqrt(projected_len), (projected_len, p.shape[-1]))
      projected = p @ (r.T @ (r @ values))
      squared.append((np.linalg.norm(projected - exact) / exact_norm) ** 2)
    errors.append(np.sqrt(np.mean(squared)))
  return np.array(errors)


def value_at_index(curve: np.ndarray, index: int) -> Tuple[float, int]:
  """(value, index used) at a 1-based index clamped to the curve's length (P's rank bound)."""
  used = max(1, min(int(index), curve.shape[-1]))
  return float(curve[..., used - 1]), used


def make_spectrum_step(model: models.MaskedLanguageModel):
  """A jitted (variables, inputs, padding_mask) -> per layer
  `attention_capture.Attended` (queries, keys, values, key_mask)."""

  def step(variables, inputs, padding_mask):
    intermediates = attention_capture.apply_capturing(model, variables, inputs, padding_mask)
    return attention_capture.attended_by_layer(intermediates, model.config)

  return jax.jit(step)


def mean_curves(
    step,
    variables,
    config: ModelConfig,
    batches: Iterable[Dict[str, np.ndarray]],
    num_sequences: int,
    to_device=lambda batch: batch,
) -> Tuple[List[np.ndarray], int]:
  """Per layer the mean curves [heads, min(n, keys)] of the first `num_sequences` rows
  with a real token of `batches` ('inputs', 'padding_mask': [batch, n]), from what
  `step` (`make_spectrum_step`) captures on each batch as `to_device` places it, P
  that of the model of `config` and `variables`; and their count."""
  sums: Optional[List[np.ndarray]] = None
  count = 0
  for batch in batches:
    mask = batch['padding_mask']
    rows = np.flatnonzero(np.asarray(mask).any(-1))[: num_sequences - count]
    if not rows.size:
      continue
    placed = to_device({'inputs': batch['inputs'], 'padding_mask': mask})
    per_layer = jax.device_get(step(variables, **placed))
    if sums is None:
      sums = [0.0] * len(per_layer)
    for layer, attended in enumerate(per_layer):
      # One sequence at a time: P is [heads, n, n], 800 MB for a batch of 32 at n = 512, 12 heads.
      for row in rows:
        one = slice(row, row + 1)
        attended_one = attention_capture.Attended(
            *(None if x is None else x[one] for x in attended)
        )
        p = attention_capture.layer_attention_weights(
            variables, config, layer, attended_one, mask[one]
        )[0]
        sums[layer] = sums[layer] + normalised_cumulative_singular_values(p)
    count += len(rows)
    if count >= num_sequences:
      break
  if not count:
    raise ConfigError(
        'The evaluation split holds no sequence with a real token; check config.data.'
    )
  return [total / count for total in sums], count


def _rounded(values: np.ndarray) -> List[float]:
  return [round(float(value), _DECIMALS) for value in values]


def spectrum_report(
    curves: Sequence[np.ndarray], *, index: int, facts: Mapping[str, Any]
) -> Dict[str, Any]:
  """The content of spectrum.json: per layer its heads' mean `curves` [heads, length] and
  their value at the 1-based `index` (the paper's 128), clamped per layer to the curve
  length, the bound on P's rank; with the run's `facts` (attention, n, k, ...)."""
  layers = []
  notes = []
  for layer, head_curves in enumerate(curves):
    mean_curve = head_curves.mean(axis=0)
    mean_value, used = value_at_index(mean_curve, index)
    heads = [
        {'head': head, 'value_at_index': _rounded(curve)[used - 1], 'curve': _rounded(curve)}
        for head, curve in enumerate(head_curves)
    ]
    if used != index:
      notes.append(
          f'layer {layer}: index {index} clamped to {used}, the rank '
          f'bound of its {head_curves.shape[-1]}-column P'
      )
    layers.append(
        {
            'layer': layer,
            'rank_bound': int(head_curves.shape[-1]),
            'index': used,
            'mean_value_at_index': round(mean_value, _DECIMALS),
            'mean_curve': _rounded(mean_curve),
            'heads': heads,
        }
    )
  return {**facts, 'index_requested': int(index), 'notes': notes, 'layers': layers}


def summary_lines(report: Mapping[str, Any]) -> List[str]:
  """One line per layer, and the notes."""
  lines = []
  for layer in report['layers']:
    values = [head['value_at_index'] for head in layer['heads']]
    lines.append(
        f"layer {layer['layer']}: cumulative singular value at index "
        f"{layer['index']} of {layer['rank_bound']}: {layer['mean_value_at_index']:.4f} "
        f'(heads {min(values):.4f} .. {max(values):.4f})'
    )
  return lines + [f'note: {note}' for note in report['notes']]


def title(report: Mapping[str, Any]) -> str:
  names = {'full': 'Transformer (full attention)', 'linformer': 'Linformer'}
  kind = names.get(report['attention'], f"attention={report['attention']}")
  if report['k'] is not None:
    kind = f"{kind} (k={report['k']})"
  return f"{kind}, n={report['n']}, step {report['step']}, {report['num_sequences']} sequences"


def plot_curves(report: Mapping[str, Any], path: str) -> None:
  """Every head's curve faint and each layer's mean bold, with the index marked."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  figure, axis = new_axes((7, 4.5))
  colors = matplotlib.colormaps['viridis'](np.linspace(0.0, 0.9, len(report['layers'])))
  for layer, color in zip(report['layers'], colors):
    x = np.arange(1, layer['rank_bound'] + 1)
    for head in layer['heads']:
      axis.plot(x, head['curve'], color=color, alpha=0.25, linewidth=0.8)
    axis.plot(x, layer['mean_curve'], color=color, linewidth=2.0, label=f"layer {layer['layer']}")
  axis.axvline(report['layers'][0]['index'], color='grey', linestyle='--', linewidth=1.0)
  axis.set_xlabel('singular value index')
  axis.set_ylabel('normalised cumulative singular value')
  axis.set_ylim(0.0, 1.02)
  axis.set_title(title(report), fontsize=10)
  axis.legend(fontsize=8, loc='lower right')
  figure.tight_layout()
  figure.savefig(path, dpi=120)


def plot_heatmap(report: Mapping[str, Any], path: str) -> None:
  """Layers x heads, each cell the cumulative singular value at the index."""
  values = np.array(
      [[head['value_at_index'] for head in layer['heads']] for layer in report['layers']]
  )
  layers, heads = values.shape
  figure, axis = new_axes((max(5.5, 2.0 + 0.7 * heads), max(3.5, 1.5 + 0.5 * layers)))
  image = axis.imshow(values, cmap='viridis', aspect='auto')
  if values.size <= 200:
    middle = (values.min() + values.max()) / 2
    for (layer, head), value in np.ndenumerate(values):
      color = 'black' if value > middle else 'white'
      axis.text(head, layer, f'{value:.3f}', ha='center', va='center', fontsize=7, color=color)
  axis.set(xticks=range(heads), yticks=range(layers), xlabel='head', ylabel='layer')
  indices = sorted({layer['index'] for layer in report['layers']})
  axis.set_title(f"value at index {', '.join(map(str, indices))}\n{title(report)}", fontsize=8)
  figure.colorbar(image, ax=axis)
  figure.tight_layout()
  figure.savefig(path, dpi=120)


def compute_spectrum(
    config: ml_collections.ConfigDict, workdir: str, *, num_sequences: int = 64, index: int = 128
) -> Dict[str, Any]:
  """The spectrum report of the newest checkpoint in workdir (see module doc); a
  ConfigError for no checkpoint, a workdir of another model, bad flags or data."""
  if num_sequences < 1:
    raise ConfigError(f'--num_sequences={num_sequences}: use a positive number.')
  if index < 1:
    raise ConfigError(f'--index={index}: use a positive (1-based) index.')
  model_config = ModelConfig.from_config(config.model)
  model_config.require_unscanned('spectrum')
  # Never a P the model did not use: a kind's own P comes from its attention_weights.
  attention_capture.require_attention_weights(model_config, 'spectrum')
  loaded = run_loading.load_run(config, workdir, with_data=True)
  model_config = loaded.parts.model_config
  step = make_spectrum_step(loaded.parts.model)
  curves, count = mean_curves(
      step,
      loaded.variables,
      model_config,
      loaded.data.eval_batches,
      num_sequences,
      loaded.parts.device_batch,
  )
  compressed = model_config.attention_kind.uses_projection
  projected = model_config.projected_len
  facts = {
      'step': loaded.step,
      'workdir': os.path.abspath(workdir),
      'eval_split': config.data.eval_split,
      'attention': model_config.attention,
      'n': model_config.max_len,
      'k': (list(projected) if isinstance(projected, tuple) else projected) if compressed else None,
      'projection': model_config.projection if compressed else None,
      'sharing': model_config.sharing if compressed else None,
      'num_layers': model_config.num_layers,
      'num_heads': model_config.num_heads,
      'num_sequences': count,
      'num_sequences_requested': int(num_sequences),
  }
  report = spectrum_report(curves, index=index, facts=facts)
  if count < num_sequences:
    report['notes'].append(
        f'the {config.data.eval_split} batches hold {count} sequences, fewer than '
        f'the {num_sequences} asked for (see config.data.max_eval_batches)'
    )
  return report


def write_outputs(report: Mapping[str, Any], out_dir: str) -> List[str]:
  """Writes spectrum.json and the two plots; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, name) for name in (SPECTRUM_FILE, CURVES_PLOT, HEATMAP_PLOT)]
  storage.write_text(paths[0], json.dumps(report, indent=1))
  plot_curves(report, paths[1])
  plot_heatmap(report, paths[2])
  return paths


@dataclasses.dataclass(frozen=True)
class SpectrumSettings:
  out: str = setting('', 'Output folder (default WORKDIR/spectrum).')
  num_sequences: int = setting(64, 'Evaluation sequences to average over.')
  index: int = setting(
      128,
      '1-based singular value index to report (the paper: 128 of 512); clamped to the rank '
      'bound of P.',
  )


def define_flags() -> None:
  cli.define_config_flags(reads_run=True)
  settings_flags.define_flags(SpectrumSettings)


def main(_):
  parsed, settings = flags.FLAGS, settings_flags.from_flags(SpectrumSettings)
  if settings.out:
    storage.check_folder(settings.out, '--out', writable=False)
  out = settings.out or os.path.join(parsed.workdir, 'spectrum')
  report = compute_spectrum(
      parsed.config, parsed.workdir, num_sequences=settings.num_sequences, index=settings.index
  )
  print(f'{title(report)}: normalised cumulative singular values of P', flush=True)
  print(*summary_lines(report), sep='\n', flush=True)
  with cli.saving_printed_results(out):
    paths = write_outputs(report, out)
  print(f"results in {', '.join(paths)}", flush=True)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
