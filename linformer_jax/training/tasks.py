"""One object per task: its data, model head, loss, metrics and reference results.

`config.task` names the task ('masked_lm', 'causal_lm' or 'classification')
in `TASKS`; `task_of` returns its object. Everything that differs between
tasks lives here, so the run builder and the training loop never branch on the
task. A new task is one `Task` subclass registered under a new name, in a file
named in config.extensions (docs/examples/shuffled_text_task.py):

  @tasks.TASKS.register('my_task')
  class MyTask(tasks.Task):
    name = 'my_task'
    ...
"""

import abc
import math
from typing import Any, Dict, Iterable, Tuple, Type

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linformer_jax.checkpoints import partial_restore
from linformer_jax.data import causal_lm
from linformer_jax.data import classification
from linformer_jax.data import masked_lm
from linformer_jax.errors import ConfigError
from linformer_jax.model import models
from linformer_jax.registry import Registry
from linformer_jax.training import fine_tuning
from linformer_jax.training import train_steps
from linformer_jax.training.run_config import RunConfig

Batch = Dict[str, np.ndarray]
# The sums every task's eval step returns, accumulated over evaluation batches.
SUM_KEYS = ('loss_sum', 'correct_sum', 'weight_sum')

# A perplexity above this describes no model (the loss diverged): reported as inf.
PERPLEXITY_LIMIT = 1e30


def unigram_perplexity(train_token_counts: np.ndarray, batches: Iterable[Batch]) -> float:
  """Perplexity at the predicted tokens of a unigram model of the training split.

  The reference a language model must beat: it predicts every target token (the
  masked ones, or every next token) from its training-set frequency alone
  (add-one smoothed).
  """
  probabilities = (train_token_counts + 1.0) / (train_token_counts.sum() + len(train_token_counts))
  log_prob, weight = 0.0, 0.0
  for batch in batches:
    log_prob += float(np.sum(np.log(probabilities[batch['targets']]) * batch['weights']))
    weight += float(np.sum(batch['weights']))
  return math.exp(-log_prob / max(weight, 1.0))


def majority_accuracy(train_label_counts: np.ndarray, batches: Iterable[Batch]) -> float:
  """Accuracy of always predicting the training split's most common class."""
  majority = int(np.argmax(train_label_counts))
  correct, weight = 0.0, 0.0
  for batch in batches:
    correct += float(np.sum((batch['labels'] == majority) * batch['weights']))
    weight += float(np.sum(batch['weights']))
  return correct / max(weight, 1.0)


class Task(abc.ABC):
  """What a run needs to know about its task; holds no state.

  Attributes:
    name: the config.task value it is registered under in `TASKS` (results
      files record it).
  """

  name: str

  @abc.abstractmethod
  def build_data(
      self,
      config: RunConfig,
      workdir: str,
      *,
      process_index: int,
      process_count: int,
      train: bool,
  ) -> Any:
    """This process's data: a tokenizer, `tokenizer_sha256` (of its model
    file, None without one; checkpoints keep it), `train_iterator` (None unless
    `train`), `eval_batches`, and the counts `reference_results` needs."""

  @abc.abstractmethod
  def create_model(self, config: RunConfig) -> nn.Module:
    """The Flax model of config.model: the encoder with this task's head."""

  @abc.abstractmethod
  def loss_sums(self, model: nn.Module, config: RunConfig) -> train_steps.LossSums:
    """The loss function the train and eval steps sum over a batch."""

  @abc.abstractmethod
  def batch_shapes(self, config: RunConfig) -> Dict[str, Tuple[Tuple[int, ...], Any]]:
    """name -> (global shape, dtype) of a training batch (for compiling only)."""

  @abc.abstractmethod
  def metrics(self, sums: Dict[str, float]) -> Dict[str, float]:
    """Evaluation metrics from the summed `SUM_KEYS` of all batches."""

  @abc.abstractmethod
  def describe(self, split: str, metrics: Dict[str, float]) -> str:
    """One line of evaluation results, e.g. for the progress report."""

  @abc.abstractmethod
  def reference_results(self, data: Any) -> Dict[str, float]:
    """The trivial model a run must beat, scored on its evaluation batches."""

  @abc.abstractmethod
  def summary(self, results: Dict[str, Any]) -> str:
    """The closing line of a finished run, from its results."""

  def check_init_from(self, config: RunConfig) -> Any:
    """Checks config.init_from before anything is built; returns what
    `initialize_from` needs. Raises ConfigError for a run it cannot use."""
    del config
    return None

  def initialize_from(
      self,
      state: train_steps.TrainState,
      abstract_state: train_steps.TrainState,
      config: RunConfig,
      checked: Any,
  ) -> Tuple[train_steps.TrainState, str]:
    """A fresh state with the parameters of run config.init_from, and a line
    saying what was loaded. `checked` is what `check_init_from` returned."""
    del checked
    params = partial_restore.restore_params(config.init_from, abstract_state.params)
    return (state.replace(params=params), f'Initialised parameters from {config.init_from}.')


class LanguageModelling(Task):
  """What masked and causal language modelling share: packed rows of
  config.model.max_len tokens, a loss at chosen positions, and a unigram model
  of the training split as the reference to beat."""

  # The metric counting the positions the loss was taken at.
  positions_metric: str
  # What the closing line calls the perplexity.
  perplexity_label: str

  def batch_shapes(self, config):
    shape = (config.loop.batch_size, config.model.max_len)
    return {
        'inputs': (shape, jnp.int32),
        'targets': (shape, jnp.int32),
        'weights': (shape, jnp.float32),
        'padding_mask': (shape, jnp.bool_),
    }

  def metrics(self, sums):
    weight = max(sums['weight_sum'], 1.0)
    loss = sums['loss_sum'] / weight
    return {
        'loss': loss,
        'accuracy': sums['correct_sum'] / weight,
        # exp(loss) above PERPLEXITY_LIMIT describes no model: it is inf.
        'perplexity': math.exp(loss) if loss < math.log(PERPLEXITY_LIMIT) else math.inf,
        self.positions_metric: sums['weight_sum'],
    }

  def describe(self, split, metrics):
    return (
        f'{split} loss {metrics["loss"]:.4f}, perplexity '
        f'{metrics["perplexity"]:.2f}, accuracy {metrics["accuracy"]:.4f}'
    )

  def reference_results(self, data):
    return {'unigram_perplexity': unigram_perplexity(data.train_token_counts, data.eval_batches)}

  def summary(self, results):
    return (
        f'{results["eval_split"]} {self.perplexity_label} {results["eval_perplexity"]:.1f} '
        f'after {results["step"]} steps (a unigram model: '
        f'{results["unigram_perplexity"]:.1f})'
    )


TASKS: Registry[Type[Task]] = Registry('config.task')


def _building_with(build_datasets: Any) -> Any:
  """A task's `build_data`: a data module's `build_datasets(config, workdir,
  *, process_index, process_count, train)`."""

  def build_data(self, config, workdir, *, process_index, process_count, train):
    del self
    return build_datasets(
        config, workdir, process_index=process_index, process_count=process_count, train=train
    )

  return build_data


@TASKS.register('masked_lm')
class MaskedLanguageModelling(LanguageModelling):
  """RoBERTa's masked-LM pretraining on packed sequences (`data.masked_lm`)."""

  name = 'masked_lm'
  positions_metric = 'masked_tokens'
  perplexity_label = 'perplexity'

  build_data = _building_with(masked_lm.build_datasets)

  def create_model(self, config):
    return models.MaskedLanguageModel(config.model)

  def loss_sums(self, model, config):
    return train_steps.masked_lm_loss(
        model, masked_lm.max_predictions(config.model.max_len, config.data.mask_rate)
    )


@TASKS.register('causal_lm')
class CausalLanguageModelling(LanguageModelling):
  """Next-token prediction on the packed sequences of masked-LM pretraining
  (`data.causal_lm`), with a left-to-right model (config.model.causal)."""

  name = 'causal_lm'
  positions_metric = 'predicted_tokens'
  perplexity_label = 'next-token perplexity'

  build_data = _building_with(causal_lm.build_datasets)

  def create_model(self, config):
    if not config.model.causal:
      raise ConfigError(
          "config.task='causal_lm' needs a left-to-right model; set config.model.causal=True."
      )
    return models.CausalLanguageModel(config.model)

  def loss_sums(self, model, config):
    del config
    return train_steps.next_token_loss(model)


@TASKS.register('classification')
class Classification(Task):
  """One label per sequence or pair (`data.classification`): fine-tuning from
  config.init_from's encoder, or training from scratch as in the LRA."""

  name = 'classification'

  build_data = _building_with(classification.build_datasets)

  def create_model(self, config):
    return models.SequenceClassifier(config.model, classification.num_classes(config))

  def loss_sums(self, model, config):
    del config
    return train_steps.classification_loss(model)

  def batch_shapes(self, config):
    shape = (config.loop.batch_size, classification.sequence_length(config))
    return {
        'inputs': (shape, jnp.int32),
        'padding_mask': (shape, jnp.bool_),
        'segments': (shape, jnp.int32),
        'labels': ((config.loop.batch_size,), jnp.int32),
        'weights': ((config.loop.batch_size,), jnp.float32),
    }

  def metrics(self, sums):
    weight = max(sums['weight_sum'], 1.0)
    return {
        'loss': sums['loss_sum'] / weight,
        'accuracy': sums['correct_sum'] / weight,
        'examples': sums['weight_sum'],
    }

  def describe(self, split, metrics):
    return f'{split} loss {metrics["loss"]:.4f}, accuracy {metrics["accuracy"]:.4f}'

  def reference_results(self, data):
    return {
        'majority_class_accuracy': majority_accuracy(data.train_label_counts, data.eval_batches)
    }

  def summary(self, results):
    return (
        f'{results["eval_split"]} accuracy {results["eval_accuracy"]:.2%} after '
        f'{results["step"]} steps (the majority class: '
        f'{results["majority_class_accuracy"]:.2%})'
    )

  def check_init_from(self, config):
    return fine_tuning.check_pretrained_encoder(config)

  def initialize_from(self, state, abstract_state, config, checked):
    state, fresh = fine_tuning.with_pretrained_encoder(
        state, abstract_state, config.init_from, checked
    )
    new = f' ({", ".join(fresh)} start at zero)' if fresh else ''
    return state, (
        f'Initialised the encoder from {config.init_from}{new}; the classification head is new.'
    )


def task_of(config: RunConfig) -> Task:
  """The task object of config.task (default 'masked_lm'); ConfigError listing
  the registered tasks for another name."""
  return TASKS.get(config.task)()


def evaluate_batches(
    task: Task, eval_step, variables, batches: Iterable[Batch], to_device=lambda batch: batch
) -> Dict[str, float]:
  """The task's metrics over all evaluation batches (one host fetch per batch)."""
  totals = dict.fromkeys(SUM_KEYS, 0.0)
  for batch in batches:
    sums = jax.device_get(eval_step(variables, to_device(batch)))
    for key in totals:
      totals[key] += float(sums[key])
  return task.metrics(totals)
