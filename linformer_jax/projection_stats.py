"""What a run's learned projections E and F hold, against how they started.

  python -m linformer_jax.projection_stats --config configs/gutenberg.py \
      --workdir runs/parity/pretrain_linformer_init_local \
      --config.model.projection_init=local

For each learned [n, k] matrix of the run's checkpoint (each head's own for
per-head weights), and for fresh draws of every `config.model.projection_init`
at the same n and k, it reports per slot (column), averaged over the k slots:

  participation   (sum w^2)^2 / sum w^4 over the n positions: how many
                  positions the slot mixes (n/k for 'local', about n/3 for
                  Gaussian entries)
  own_window      the share of the slot's squared weight inside its own
                  window of n/k adjacent positions (1 for 'local')
  norm            the slot's L2 norm
  negative        the share of its weights below zero
  slot_sum        the signed sum of the slot's weights (1 for 'local')
  effective_rank  exp of the entropy of the matrix's normalised squared
                  singular values (k for orthogonal slots)

and, against the same matrix at the run's step 0 (drawn again from `config.seed`):

  drift           ||E - E0|| / ||E0|| (Frobenius norms)
  common_share    the share of ||E - E0||^2 in one vector added to every
                  slot alike: 1 when every slot moved the same way
  drift_slot_sum  the signed sum of the change, per slot (averaged)

It prints them and writes WORKDIR/projection_stats.json (projection_stats_STEP.json
for a step asked), whose `projection_init` is the run's for 'linear' and 'random',
the kinds it initialises, and 'not used' for others; docs/results_parity.md reads them.
"""

import dataclasses
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.errors import ConfigError
from linformer_jax.model import projections
from linformer_jax.model.layers import PROJECTION_NAMES
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.model.projections import linear
from linformer_jax.settings_flags import setting
from linformer_jax.training import run_loading


def matrix_stats(matrix: np.ndarray, window: int) -> Dict[str, float]:
  """The statistics above of one [n, k] matrix; `window` = n / k positions."""
  matrix = np.asarray(matrix, np.float64)
  n, k = matrix.shape
  squares = matrix**2
  participation = squares.sum(0) ** 2 / np.maximum((squares**2).sum(0), 1e-300)
  # Window w of the sequence is slot w % k's (one window per block when causal).
  own_mask = (np.arange(n)[:, None] // window) % k == np.arange(k)[None, :]
  own = (squares * own_mask).sum(0) / squares.sum(0)
  singular = np.linalg.svd(matrix, compute_uv=False)
  weights = singular**2 / (singular**2).sum()
  entropy = -(weights * np.log(np.where(weights > 0, weights, 1.0))).sum()
  return {
      'participation': float(participation.mean()),
      'own_window': float(own.mean()),
      'norm': float(np.sqrt(squares.sum(0)).mean()),
      'negative': float((matrix < 0).mean()),
      'slot_sum': float(matrix.sum(0).mean()),
      'effective_rank': float(np.exp(entropy)),
  }


def drift_stats(trained: np.ndarray, initial: np.ndarray) -> Dict[str, float]:
  """How far an [n, k] matrix moved from `initial`, and how much of the move
  is one vector added to every slot (see the module docstring)."""
  change = np.asarray(trained, np.float64) - np.asarray(initial, np.float64)
  total = (change**2).sum()
  common = change.mean(axis=1)  # per position, the change's mean over the k slots
  common_energy = (common**2).sum() * change.shape[1]  # that vector, in every slot
  return {
      'drift': float(np.sqrt(total / np.maximum((np.asarray(initial) ** 2).sum(), 1e-300))),
      'common_share': float(common_energy / total) if total > 0 else 0.0,
      'drift_slot_sum': float(change.sum(0).mean()),
  }


def _mean(stats: List[Dict[str, float]]) -> Dict[str, float]:
  """Each statistic's mean over the matrices."""
  return {name: float(np.mean([s[name] for s in stats])) for name in stats[0]}


def _projected_lens(model_config: ModelConfig) -> List[int]:
  """The k of the run's layers, each once, ascending."""
  layers = range(model_config.num_layers)
  return sorted({model_config.projected_len_for_layer(layer) for layer in layers})


def learned_matrices(
    params: Mapping[str, Any], model_config: ModelConfig
) -> Iterator[Tuple[str, List[np.ndarray]]]:
  """(path, its [n, k] matrices E) of every learned projection weight, E as the run's
  projection kind applies it (`effective_matrix`): one per head of a per-head weight and
  per layer of scanned layers. A kind with weights but no effective E is a ConfigError."""
  kind = projections.kind(model_config.projection)
  lens = _projected_lens(model_config)
  per_head = model_config.sharing == 'none'
  weight_ndim = kind.weight_ndim + per_head
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if getattr(path[-1], 'key', None) not in PROJECTION_NAMES:
      continue
    name = '/'.join(str(getattr(key, 'key', key)) for key in path)
    leaf = np.asarray(leaf, np.float32)
    # Scanned layers stack each layer's weight on a leading axis.
    weights = leaf.reshape(-1, *leaf.shape[leaf.ndim - weight_ndim :])
    matrices = []
    for weight in weights:
      projected_len = lens[0] if len(lens) == 1 else weight.shape[-1]
      matrix = kind.effective_matrix(
          jnp.asarray(weight), max_len=model_config.max_len, projected_len=projected_len
      )
      if matrix is None:
        raise ConfigError(
            f'projection={model_config.projection!r} gives no effective E (its kind neither '
            'mixes_positions_linearly nor defines effective_matrix), so projection_stats has '
            'no matrix to describe; define effective_matrix for it (docs/extending.md).'
        )
      matrices += list(np.asarray(matrix, np.float64).reshape(-1, *matrix.shape[-2:]))
    yield name, matrices


# What the report says of `projection_init` for a kind whose weights it does not initialise.
INIT_NOT_USED = 'not used'


def _initialised_by_projection_init(kind: projections.SequenceProjectionKind) -> bool:
  """Whether `config.model.projection_init` draws the kind's weights: the
  [n, k] matrices of 'linear' and 'random'; pooling has no weights, and 'conv'
  and a kind of one's own draw theirs their own way."""
  return isinstance(kind, linear.LearnedMatrix)


def recorded_init(model_config: ModelConfig) -> str:
  """The report's `projection_init`: the run's, or INIT_NOT_USED for a kind
  whose weights it does not initialise."""
  kind = projections.kind(model_config.projection)
  return model_config.projection_init if _initialised_by_projection_init(kind) else INIT_NOT_USED


def initial_stats(model_config: ModelConfig, projected_len: int) -> Dict[str, Dict[str, float]]:
  """The statistics of a fresh [n, k] draw of each `projection_init` of a
  learned matrix that the run's kind takes (seed 0); none for other kinds."""
  kind = projections.kind(model_config.projection)
  if not _initialised_by_projection_init(kind):
    return {}
  window = model_config.compressed_span // projected_len
  stats = {}
  for init in (init for init in linear.MATRIX_INITS if init in kind.projection_inits):
    config = dataclasses.replace(model_config, projection_init=init, projection_init_noise=0.0)
    draw = linear.matrix_initializer(config, projected_len, per_head=False)
    matrix = draw(jax.random.PRNGKey(0), (model_config.max_len, projected_len))
    stats[init] = matrix_stats(np.asarray(matrix), window)
  return stats


def projection_report(
    config: ml_collections.ConfigDict, workdir: str, step: Optional[int] = None
) -> Dict[str, Any]:
  """The report of the newest checkpoint in `workdir` (or its kept `step`): per learned
  matrix its statistics and its drift from the run's step 0, and the statistics of fresh
  draws of every initialisation. ConfigError: no (such) checkpoint, or another model's."""
  loaded = run_loading.load_run(config, workdir, step)
  parts, step, variables = loaded.parts, loaded.step, loaded.variables
  model_config = parts.model_config
  lens = _projected_lens(model_config)
  start = dict(learned_matrices(parts.initial_variables(config.seed)['params'], model_config))
  matrices = {}
  for path, found in learned_matrices(variables['params'], model_config):
    window = model_config.compressed_span // found[0].shape[-1]
    matrices[path] = {
        **_mean([matrix_stats(matrix, window) for matrix in found]),
        **_mean([drift_stats(trained, initial) for trained, initial in zip(found, start[path])]),
    }
  return {
      'step': step,
      'seed': config.seed,
      'projection': model_config.projection,
      'projection_init': recorded_init(model_config),
      'max_len': model_config.max_len,
      'projected_len': lens,
      'learned': matrices,
      'initial': {
          str(k): stats
          for k in lens
          if (stats := initial_stats(model_config, k))  # none for a kind of its own
      },
  }


def summary_lines(report: Mapping[str, Any]) -> List[str]:
  """One line per learned matrix and per fresh initialisation."""

  def line(name: str, stats: Mapping[str, float]) -> str:
    text = (
        f'{name}: participation {stats["participation"]:.1f}, own window '
        f'{stats["own_window"]:.3f}, norm {stats["norm"]:.3f}, negative '
        f'{stats["negative"]:.3f}, slot sum {stats["slot_sum"]:+.3f}, effective rank '
        f'{stats["effective_rank"]:.1f}'
    )
    if 'drift' in stats:
      text += (
          f'; drift from step 0 {stats["drift"]:.3f}, common to all slots '
          f'{stats["common_share"]:.2f}, its slot sum {stats["drift_slot_sum"]:+.3f}'
      )
    return text

  lines = [line(f'step {report["step"]} {path}', s) for path, s in report['learned'].items()]
  for k, by_init in report['initial'].items():
    lines += [line(f'fresh {init} (k={k})', s) for init, s in by_init.items()]
  return lines


@dataclasses.dataclass(frozen=True)
class StatsSettings:
  step: int = setting(0, 'A kept step to read instead of the newest (0).')


def define_flags() -> None:
  cli.define_config_flags(reads_run=True)
  settings_flags.define_flags(StatsSettings)


def main(_):
  parsed, settings = flags.FLAGS, settings_flags.from_flags(StatsSettings)
  if settings.step < 0:
    cli.fail(f'--step={settings.step} is not allowed: use a kept step, or 0 for the newest.')
  workdir = storage.location(parsed.workdir)
  report = projection_report(parsed.config, workdir, settings.step or None)
  for line in summary_lines(report):
    print(line, flush=True)
  asked = settings.step or parsed.config.restore_step
  name = f'projection_stats_{asked}.json' if asked else 'projection_stats.json'
  path = os.path.join(workdir, name)
  cli.save_printed_report(path, report)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
