"""How far a ListOps run is past the task's shortcuts: the outermost operator, then its digits.

  python -m linformer_jax.listops_shortcuts --workdir runs/listops_cpu_linformer
  python -m linformer_jax.listops_shortcuts --workdir runs/sweeps/rivals_listops/performer-n512-s0 \
      --split=test --step=1500

A ListOps tree's value leans heavily on its outermost operator alone: on the
Long Range Arena's generator about half of the MAX trees are worth 9 and half
of the MIN trees 0, while MED and SM trees spread over the values. Three
rules, fitted on the run's training split, mark the rungs a model climbs
before it evaluates the nesting:

  majority         the most frequent value, whatever the tree
  outer operator   the most frequent value of the trees with the same
                   outermost operator; its loss is the cross-entropy of their
                   values' distribution, the least a model that reads only the
                   first token can reach
  root digits      for MAX and MIN, the largest / smallest of the outermost
                   operator's own digit arguments (a bound on the value: its
                   subtrees are not read); the outer-operator rule otherwise

For the run's checkpoint it reports, on the split: its accuracy and loss; how
often it predicts the class its own most frequent prediction for that
outermost operator is (`follows_outer_operator`, 1 for a model whose answer
depends on the first token alone); how often it agrees with the outer-operator
rule; and per operator its accuracy, the rule's, and the classes it predicts
with their shares. It prints them and writes WORKDIR/listops_shortcuts_SPLIT.json
(listops_shortcuts_SPLIT_STEP.json for a step asked); docs/results_rivals.md
reads them.
"""

import collections
import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from absl import flags
import numpy as np

from linformer_jax import api
from linformer_jax import cli
from linformer_jax import settings_flags
from linformer_jax import storage
from linformer_jax.data import classification_sources
from linformer_jax.data import listops
from linformer_jax.errors import ConfigError
from linformer_jax.settings_flags import setting

# Rows per forward pass: one shape for every batch, so the pass compiles once.
BATCH_SIZE = 100
SPLITS = ('validation', 'test', 'train')


def outer_operator(source: str) -> str:
  """The outermost operator of a tree's prefix form ('MAX'), or 'digit' for a bare digit."""
  first = source.split(maxsplit=1)[0]
  return first[1:] if first.startswith('[') else 'digit'


def root_digits(source: str) -> List[int]:
  """The digits that are the outermost operator's own arguments, in order."""
  depth, digits = 0, []
  for token in source.split():
    if token.startswith('['):
      depth += 1
    elif token == listops.CLOSE:
      depth -= 1
    elif depth == 1:
      digits.append(int(token))
  return digits


def _distribution(labels: Sequence[int]) -> np.ndarray:
  counts = np.bincount(np.asarray(labels, np.int64), minlength=listops.NUM_CLASSES)
  return counts / counts.sum()


def _cross_entropy(distributions: np.ndarray, labels: np.ndarray) -> float:
  """Mean -log p(label), with p floored at 1e-12 (a value a rule never saw)."""
  chosen = distributions[np.arange(len(labels)), labels]
  return float(-np.mean(np.log(np.maximum(chosen, 1e-12))))


@dataclasses.dataclass(frozen=True)
class ShortcutRules:
  """The rules of the module doc, fitted on a training split."""

  majority: int  # the most frequent value
  overall: np.ndarray  # [NUM_CLASSES] the values' distribution
  by_operator: Dict[str, np.ndarray]  # outermost operator -> its values' distribution

  @classmethod
  def fit(cls, sources: Sequence[str], labels: Sequence[int]) -> 'ShortcutRules':
    overall = _distribution(labels)
    grouped = collections.defaultdict(list)
    for source, label in zip(sources, labels):
      grouped[outer_operator(source)].append(label)
    by_operator = {operator: _distribution(values) for operator, values in grouped.items()}
    return cls(int(np.argmax(overall)), overall, by_operator)

  def operator_distribution(self, operator: str) -> np.ndarray:
    """An operator's values' distribution; the overall one for an operator
    the training split never had at the root."""
    return self.by_operator.get(operator, self.overall)

  def outer_operator_guess(self, source: str) -> int:
    return int(np.argmax(self.operator_distribution(outer_operator(source))))

  def root_digits_guess(self, source: str) -> int:
    operator, digits = outer_operator(source), root_digits(source)
    if operator == 'MAX' and digits:
      return max(digits)
    if operator == 'MIN' and digits:
      return min(digits)
    return self.outer_operator_guess(source)


def baselines(rules: ShortcutRules, sources: Sequence[str], labels: np.ndarray) -> Dict[str, Any]:
  """Each rule's accuracy on (sources, labels), and the loss of the two that
  give a distribution."""
  labels = np.asarray(labels)
  operator_guesses = np.array([rules.outer_operator_guess(s) for s in sources])
  digit_guesses = np.array([rules.root_digits_guess(s) for s in sources])
  by_operator = np.stack([rules.operator_distribution(outer_operator(s)) for s in sources])
  return {
      'majority': {
          'class': rules.majority,
          'accuracy': float(np.mean(labels == rules.majority)),
          'loss': _cross_entropy(np.broadcast_to(rules.overall, by_operator.shape), labels),
      },
      'outer_operator': {
          'class_by_operator': {
              operator: int(np.argmax(d)) for operator, d in sorted(rules.by_operator.items())
          },
          'accuracy': float(np.mean(operator_guesses == labels)),
          'loss': _cross_entropy(by_operator, labels),
      },
      'root_digits': {'accuracy': float(np.mean(digit_guesses == labels))},
  }


def prediction_report(
    rules: ShortcutRules, sources: Sequence[str], labels: np.ndarray, logits: np.ndarray
) -> Dict[str, Any]:
  """What a model's logits [len(sources), NUM_CLASSES] do on (sources, labels):
  the measures of the module doc."""
  labels, logits = np.asarray(labels), np.asarray(logits, np.float64)
  predictions = logits.argmax(-1)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  operators = np.array([outer_operator(s) for s in sources])
  rule = np.array([rules.outer_operator_guess(s) for s in sources])
  follows = np.zeros(len(sources), bool)
  per_operator = {}
  for operator in sorted(set(operators)):
    rows = operators == operator
    counts = collections.Counter(predictions[rows].tolist()).most_common()
    follows[rows] = predictions[rows] == counts[0][0]
    per_operator[operator] = {
        'trees': int(rows.sum()),
        'accuracy': float(np.mean(predictions[rows] == labels[rows])),
        'rule_accuracy': float(np.mean(rule[rows] == labels[rows])),
        'predicted': [[int(c), n / int(rows.sum())] for c, n in counts[:3]],
    }
  return {
      'accuracy': float(np.mean(predictions == labels)),
      'loss': float(-np.mean(log_probs[np.arange(len(labels)), labels])),
      'follows_outer_operator': float(np.mean(follows)),
      'agrees_with_outer_operator_rule': float(np.mean(predictions == rule)),
      'per_operator': per_operator,
  }


def _logits(run: api.Run, sources: Sequence[str]) -> np.ndarray:
  """The run's classifier logits for every source, in batches of one shape."""
  seq_len = run.model_config.max_len
  token_ids = np.asarray([listops.encode(s, seq_len) for s in sources], np.int32)
  filler = (-len(token_ids)) % BATCH_SIZE  # copies of the first row, dropped after
  token_ids = np.concatenate([token_ids, np.repeat(token_ids[:1], filler, axis=0)])
  batches = [
      np.asarray(run.logits(rows, rows != listops.PAD_ID), np.float32)
      for rows in np.split(token_ids, len(token_ids) // BATCH_SIZE)
  ]
  return np.concatenate(batches)[: len(sources)]


def shortcut_report(
    config: Any, workdir: str, split: str = 'validation', step: Optional[int] = None
) -> Dict[str, Any]:
  """The report of the module doc for a ListOps run's checkpoint.

  Raises:
    ConfigError: a run that is not a ListOps classifier, a split ListOps does
      not have, or what loading the run refuses.
  """
  if split not in SPLITS:
    raise ConfigError(f'--split={split!r} is not a ListOps split; use one of {", ".join(SPLITS)}.')
  run = api.load(workdir, step, config=config)
  settings = run.parts.settings
  if settings.task != 'classification' or settings.data.source != 'listops':
    raise ConfigError(
        f'{workdir} is a {settings.task} run on {settings.data.source!r}; '
        "listops_shortcuts reads a classifier trained on config.data.source='listops'."
    )
  source = classification_sources.source_of(settings.data)
  train = source.examples(settings.data, settings.data.train_split)
  scored = source.examples(settings.data, split)
  rules = ShortcutRules.fit([t for (t,) in train.texts], train.labels)
  sources = [t for (t,) in scored.texts]
  return {
      'workdir': workdir,
      'step': run.step,
      'attention': run.model_config.attention,
      'split': split,
      'trees': len(sources),
      'rules_fitted_on': f'{settings.data.train_split} ({len(train.labels):,} trees)',
      'baselines': baselines(rules, sources, scored.labels),
      'run': prediction_report(rules, sources, scored.labels, _logits(run, sources)),
  }


def summary_lines(report: Mapping[str, Any]) -> List[str]:
  """The baselines, the run's line, then one line per outermost operator."""
  base, run = report['baselines'], report['run']
  rule = ', '.join(f'{op} {c}' for op, c in base['outer_operator']['class_by_operator'].items())
  lines = [
      f"{report['split']} split, {report['trees']:,} trees; rules fitted on "
      f"{report['rules_fitted_on']}:",
      f"  majority class ({base['majority']['class']}): accuracy "
      f"{base['majority']['accuracy']:.1%}, loss {base['majority']['loss']:.3f}",
      f"  outer operator ({rule}): accuracy {base['outer_operator']['accuracy']:.1%}, "
      f"loss {base['outer_operator']['loss']:.3f}",
      f"  root digits (MAX, MIN of the root's own digits): accuracy "
      f"{base['root_digits']['accuracy']:.1%}",
      f"{report['attention']} run, step {report['step']}: accuracy {run['accuracy']:.1%}, "
      f"loss {run['loss']:.3f}; follows its outer operator in "
      f"{run['follows_outer_operator']:.1%} of trees, agrees with the outer-operator rule "
      f"in {run['agrees_with_outer_operator_rule']:.1%}",
  ]
  for operator, found in run['per_operator'].items():
    predicted = ', '.join(f'{c} ({share:.0%})' for c, share in found['predicted'])
    lines.append(
        f"  {operator}: {found['trees']} trees, accuracy {found['accuracy']:.1%} "
        f"(rule {found['rule_accuracy']:.1%}); predicts {predicted}"
    )
  return lines


@dataclasses.dataclass(frozen=True)
class ShortcutSettings:
  split: str = setting('validation', 'The split to score.', choices=SPLITS)
  step: int = setting(0, 'A kept step to read instead of the newest (0).', minimum=0)

  def __post_init__(self):
    settings_flags.check(self)


def define_flags() -> None:
  cli.define_config_flags(reads_run=True)
  settings_flags.define_flags(ShortcutSettings)


def main(_):
  parsed, settings = flags.FLAGS, settings_flags.from_flags(ShortcutSettings)
  workdir = storage.location(parsed.workdir)
  report = shortcut_report(parsed.config, workdir, settings.split, settings.step or None)
  print(*summary_lines(report), sep='\n', flush=True)
  asked = settings.step or parsed.config.restore_step
  suffix = f'_{asked}' if asked else ''
  path = os.path.join(workdir, f'listops_shortcuts_{settings.split}{suffix}.json')
  cli.save_printed_report(path, report)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
