"""The Python API: a run trained, loaded or freshly built, in one line.

  import linformer_jax

  trained = linformer_jax.train(config, '/tmp/tiny')  # trains (or resumes), then loads
  run = linformer_jax.load('/tmp/tiny')               # the newest kept checkpoint
  token_ids, padding_mask = run.encode(['def main():', 'import os'])
  logits = run.logits(token_ids, padding_mask)        # the task head's output
  output = run(['def main():'], output_hidden_states=True, output_attentions=True)

  fresh = linformer_jax.build(config)                 # initialised as a new run of config
  run.save_pretrained('/tmp/tiny_hf')                 # a folder transformers loads
  read_back = linformer_jax.load('/tmp/tiny_hf')      # a Hugging Face masked-LM folder, at step 0

`train`, `load` and `build` give the same `Run`: the run's config, model,
variables and tokenizer, the passes a researcher reaches for (`logits`,
`hidden_states`, `attention`, all three at once by calling the run,
`fill_mask`, `evaluate`) and the export to a Hugging Face folder
(`save_pretrained`). docs/api.md documents the whole surface. They build
through the training code's own path (`training.run_builder.build_parts`,
`training.run_loading.load_run`, `training.trainer`), and all import the
config's `extensions` first, so a run of a projection or attention kind of
your own loads as a built-in one does. `load` of a Hugging Face folder reads
it as import_checkpoint does (`training.hf_import`), in memory.

What the passes read is made in `data.inference_inputs`: texts encoded into
padded rows, token ids checked, fill_mask's rows and guesses (its `PADDING`
and `MASK_MARKER` are this module's names too). The passes themselves are one
jitted function, `model.forward_pass.forward`.

The package exports this module's public names lazily
(linformer_jax/__init__.py): importing linformer_jax does not import JAX, so
the commands can set XLA's flags first.
"""

import copy
import dataclasses
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import ml_collections
import numpy as np

from linformer_jax import extensions
from linformer_jax import registry
from linformer_jax import storage
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_conversion
from linformer_jax.checkpoints import hf_export
from linformer_jax.checkpoints import hf_tensors
from linformer_jax.data import inference_inputs
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.data.inference_inputs import MASK_MARKER as MASK_MARKER
from linformer_jax.data.inference_inputs import PADDING as PADDING
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_capture
from linformer_jax.model import forward_pass
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import hf_import
from linformer_jax.training import loop_actions
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import run_loading
from linformer_jax.training import tasks
from linformer_jax.training import trainer

ArrayLike = Union[jax.Array, np.ndarray, Sequence[Sequence[int]]]
# What the passes read: texts (encoded with `Run.encode`'s defaults) or token ids.
Inputs = Union[Sequence[str], ArrayLike]


def _shape_text(array: Any) -> str:
  """'float32[2, 13, 260]' for an array, 'None' for None."""
  if array is None:
    return 'None'
  return f'{np.dtype(array.dtype).name}[{", ".join(map(str, np.shape(array)))}]'


class LayerAttention(NamedTuple):
  """What one layer attends with, on a batch (`Run.attention`).

  Attributes:
    probabilities: float64 [batch, heads, n, keys], the weights P the
      layer's kind applies (`AttentionKind.attention_weights`; softmax(Q K^T /
      sqrt(d)) for the Transformer and the Linformer): each real query's row
      sums to 1 over the keys it may attend to; a padded query's row is zero.
    queries: [batch, n, heads, head_dim].
    keys: the keys P is over: [batch, n, heads, head_dim] for the
      Transformer, the k compressed keys E^T K [batch, k, heads, head_dim]
      for the Linformer.
    key_mask: [batch, keys], True for the keys that may be attended to (the
      real tokens; for the Linformer, the slots holding one), or None for all.
  """

  probabilities: np.ndarray
  queries: jax.Array
  keys: jax.Array
  key_mask: Optional[jax.Array]

  def __repr__(self) -> str:
    return (
        f'LayerAttention(probabilities={_shape_text(self.probabilities)}, '
        f'queries={_shape_text(self.queries)}, keys={_shape_text(self.keys)}, '
        f'key_mask={_shape_text(self.key_mask)})'
    )


class ModelOutput(NamedTuple):
  """What calling a `Run` returns: the logits, and what else was asked for.

  Attributes:
    logits: float32 masked-LM or causal-LM logits [batch, length,
      vocab_size], or classifier logits [batch, num_classes].
    hidden_states: with output_hidden_states, num_layers + 1 arrays [batch,
      length, hidden_dim]: the embeddings' output, then each layer's (the last
      is the encoder's output, after the final layer norm of a pre-LN model);
      else None.
    attentions: with output_attentions, per layer the float64 probabilities P
      [batch, heads, length, keys] (`LayerAttention.probabilities`); else None.
  """

  logits: jax.Array
  hidden_states: Optional[Tuple[jax.Array, ...]] = None
  attentions: Optional[Tuple[np.ndarray, ...]] = None

  def __repr__(self) -> str:
    parts = [f'logits={_shape_text(self.logits)}']
    for name in ('hidden_states', 'attentions'):
      arrays = getattr(self, name)
      if arrays is not None:
        parts.append(f'{name}={len(arrays)} x {_shape_text(arrays[0])}')
    return f'ModelOutput({", ".join(parts)})'


@dataclasses.dataclass(eq=False)
class Run(run_loading.LoadedRun):
  """A model with its variables: a kept checkpoint (`load`, `train`) or a
  fresh draw (`build`), in the one shape every reader of a run gets
  (`training.run_loading.LoadedRun`: config, parts, variables, tokenizer,
  step, workdir, data), with the methods a researcher calls.

  The passes run in inference mode (no dropout), jitted once per model and
  input shape. Each takes `params=`, a tree shaped as `params`, in its place:
  `jax.grad(lambda p: run.logits(token_ids, params=p).sum())(run.params)`.
  """

  @property
  def model(self) -> Any:
    """The task's Flax model (masked LM, causal LM or classifier)."""
    return self.parts.model

  @property
  def model_config(self) -> ModelConfig:
    """The checked `config.model`."""
    return self.parts.model_config

  @property
  def params(self) -> Dict[str, Any]:
    """The trained (or freshly drawn) parameters, `variables['params']`."""
    return self.variables['params']

  @property
  def num_parameters(self) -> int:
    """How many numbers `params` holds."""
    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(self.params)))

  def __repr__(self) -> str:
    config = self.model_config
    where = f'workdir={self.workdir!r}, ' if self.workdir else ''
    projected = f', k={config.projected_len}' if config.attention_kind.uses_projection else ''
    data = f', data={self.config.data.eval_split!r}' if self.data is not None else ''
    return (
        f'Run({where}step={self.step}, task={self.parts.task.name!r}, '
        f'attention={config.attention!r}, n={config.max_len}{projected}, '
        f'layers={config.num_layers}, hidden={config.hidden_dim}, heads={config.num_heads}, '
        f'vocab={config.vocab_size}, parameters={self.num_parameters:,}{data})'
    )

  def save_pretrained(self, out_dir: str) -> Dict[str, Any]:
    """Writes the run as a Hugging Face folder, as `export_checkpoint` does.

    A RoBERTa- or BERT-shaped Transformer becomes a plain transformers folder;
    any other Linformer or Transformer a `model_type: linformer` folder with its
    PyTorch code (`trust_remote_code=True`). docs/checkpoint_import.md.

    Args:
      out_dir: the folder to write; it must not exist, or be empty.

    Returns:
      What was written: the class, the auto class, the tensors, the tokenizer.

    Raises:
      ConfigError: a run that cannot be exported (a rival attention kind, an
        extension's parts) or a used out_dir; nothing is written.
    """
    return hf_export.export_folder(self.config, self.variables, self.tokenizer, out_dir)

  def encode(
      self,
      texts: Sequence[str],
      text_pairs: Optional[Sequence[str]] = None,
      *,
      padding: str = 'longest',
      max_length: Optional[int] = None,
      truncation: bool = True,
      return_segment_ids: bool = False,
  ) -> Tuple[np.ndarray, ...]:
    """Texts as rows the model reads: `[bos] text [eos]`, or with `text_pairs`
    `[bos] text SEP pair [eos]` (SEP: the tokenizer's pair separator), padded.

    Args:
      texts: a list of strings, one row each.
      text_pairs: the second text of each row, as many as `texts`.
      padding: 'longest' pads to the longest row, 'max_length' to max_length
        (one shape for every batch: the passes compile once).
      max_length: the most tokens a row may hold, at most (and by default)
        config.model.max_len.
      truncation: True cuts a longer row to max_length (its end; of a pair,
        the longer text first) with a warning naming the tokens dropped; False
        refuses it.
      return_segment_ids: also return the segment ids (0 up to the first
        separator, 1 after), for a model with segments (model.num_segments >=
        2); such a model's pairs need them.

    Returns:
      (token_ids int32 [len(texts), length], padding_mask bool [len(texts),
      length], True for real tokens), with `return_segment_ids` and the
      segment ids int32 [len(texts), length].

    Raises:
      ValueError: a single string instead of a list, a run without a
        tokenizer, a bad setting, a row longer than max_length with
        truncation=False, or pairs for a model with segments without
        return_segment_ids.
    """
    return inference_inputs.encode(
        self._text_tokenizer(),
        texts,
        text_pairs,
        max_len=self.model_config.max_len,
        num_segments=self.model_config.num_segments,
        padding=padding,
        max_length=max_length,
        truncation=truncation,
        return_segment_ids=return_segment_ids,
    )

  def logits(
      self,
      inputs: Inputs,
      padding_mask: Optional[ArrayLike] = None,
      segment_ids: Optional[ArrayLike] = None,
      *,
      params: Optional[Dict[str, Any]] = None,
  ) -> jax.Array:
    """The output of the run's task head.

    Args:
      inputs: int token ids [batch, length], length at most
        config.model.max_len; or a list of texts, encoded with `encode`'s
        defaults.
      padding_mask: bool [batch, length], True for real tokens; None: all real.
      segment_ids: int [batch, length], for a model with segments
        (model.num_segments >= 2); None: all 0.
      params: parameters to use instead of `params` (e.g. under jax.grad).

    Returns:
      float32 masked-LM or causal-LM logits [batch, length, vocab_size], or
      classifier logits [batch, num_classes].
    """
    return self(inputs, padding_mask, segment_ids, params=params).logits

  def hidden_states(
      self,
      inputs: Inputs,
      padding_mask: Optional[ArrayLike] = None,
      segment_ids: Optional[ArrayLike] = None,
      *,
      per_layer: bool = False,
      params: Optional[Dict[str, Any]] = None,
  ) -> Union[jax.Array, Tuple[jax.Array, ...]]:
    """The encoder's output, what the task head reads.

    Args:
      inputs, padding_mask, segment_ids, params: as for `logits`.
      per_layer: instead, as Hugging Face's `output_hidden_states`, the
        embeddings' output and every layer's: num_layers + 1 of them, the last
        the encoder's output (after the final layer norm of a pre-LN model).

    Returns:
      [batch, length, hidden_dim] in the compute dtype; with `per_layer` a
      tuple of num_layers + 1 of them.

    Raises:
      ConfigError: `per_layer` for a model with scanned layers.
    """
    self._require_encoder()
    if per_layer:
      self.model_config.require_unscanned('hidden_states(per_layer=True)')
    batch = self._batch(inputs, padding_mask, segment_ids)
    _, hidden, _ = forward_pass.forward(
        self._variables(params),
        *batch,
        model=self.model,
        config=self.model_config,
        logits=False,
        hidden='all' if per_layer else 'last',
        attention=False,
    )
    return hidden if per_layer else hidden[-1]

  def attention(
      self,
      inputs: Inputs,
      layer: int,
      padding_mask: Optional[ArrayLike] = None,
      segment_ids: Optional[ArrayLike] = None,
      *,
      params: Optional[Dict[str, Any]] = None,
  ) -> LayerAttention:
    """A layer's attention probabilities P, queries and the keys P is over.

    P is the kind's own (`AttentionKind.attention_weights`) in float64,
    computed from the queries, keys and values the layer attended with in the
    pass (`model.attention_capture`): softmax(Q K^T / sqrt(d)) over the k
    compressed keys for the Linformer and the n keys for the Transformer.

    Args:
      inputs, padding_mask, segment_ids: as for `logits`.
      layer: the layer, 0 to num_layers - 1.
      params: parameters to use instead of `params`; concrete ones: P is
        computed in NumPy, so no gradient flows through it.

    Raises:
      ValueError: a layer out of range, or traced params.
      ConfigError: a causal model, scanned layers, or an attention kind that
        weighs its keys without saying how
        (`attention_capture.require_attention_weights`).
    """
    config = self.model_config
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < config.num_layers:
      raise ValueError(f'layer={layer!r}: use a layer from 0 to {config.num_layers - 1}.')
    batch = self._batch(inputs, padding_mask, segment_ids)
    attended = self._queries_and_keys(batch, params, 'attention()')[layer]
    probabilities = attention_capture.layer_attention_weights(
        self._variables(params), config, layer, attended, batch[1]
    )
    return LayerAttention(probabilities, attended.queries, attended.keys, attended.key_mask)

  def __call__(
      self,
      inputs: Inputs,
      padding_mask: Optional[ArrayLike] = None,
      segment_ids: Optional[ArrayLike] = None,
      *,
      output_hidden_states: bool = False,
      output_attentions: bool = False,
      params: Optional[Dict[str, Any]] = None,
  ) -> ModelOutput:
    """The logits, and with them the hidden states and attentions, in one pass.

    Args:
      inputs, padding_mask, segment_ids, params: as for `logits`.
      output_hidden_states: also the embeddings' and every layer's output,
        as `hidden_states(per_layer=True)`.
      output_attentions: also every layer's P, as `attention(...).probabilities`
        (computed in NumPy: not with traced params).

    Returns:
      ModelOutput(logits, hidden_states, attentions), None for what was not
      asked for.

    Raises:
      ConfigError: hidden states or attentions of a model with scanned
        layers; attentions of a model `attention` refuses.
    """
    if output_hidden_states:
      self._require_encoder()
      self.model_config.require_unscanned('output_hidden_states')
    batch = self._batch(inputs, padding_mask, segment_ids)
    if output_attentions:
      _require_concrete(params, 'output_attentions')
      self._require_attention('output_attentions')
    logits, hidden, queries_and_keys = forward_pass.forward(
        self._variables(params),
        *batch,
        model=self.model,
        config=self.model_config,
        logits=True,
        hidden='all' if output_hidden_states else None,
        attention=output_attentions,
    )
    attentions = None
    if output_attentions:
      variables = self._variables(params)
      attentions = tuple(
          attention_capture.layer_attention_weights(
              variables, self.model_config, layer, attended, batch[1]
          )
          for layer, attended in enumerate(queries_and_keys)
      )
    return ModelOutput(logits, hidden, attentions)

  def fill_mask(
      self, texts: Union[str, Sequence[str]], top_k: int = 5
  ) -> Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]]:
    """The masked-LM head's best guesses for the `<mask>` of a text.

    Args:
      texts: a text holding one `<mask>`, or a list of them.
      top_k: how many guesses, the likeliest first.

    Returns:
      For one text, `top_k` dicts, as Hugging Face's fill-mask pipeline gives:
      'score' (the head's probability), 'token' (its id), 'token_str' (its
      text) and 'sequence' (the text with it in place of `<mask>`); for a
      list, one such list per text.

    Raises:
      ConfigError: a run that is not a masked LM.
      ValueError: a text without exactly one `<mask>`, longer than
        config.model.max_len, or a bad top_k.
    """
    if not isinstance(self.parts.task, tasks.MaskedLanguageModelling):
      raise ConfigError(
          f'fill_mask needs a masked-LM run; this one is config.task={self.config.task!r}.'
      )
    tokenizer = self._text_tokenizer()
    vocab_size = self.model_config.vocab_size
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab_size:
      raise ValueError(f'top_k={top_k!r}: use an integer from 1 to {vocab_size}.')
    one = isinstance(texts, str)
    texts = [texts] if one else inference_inputs.text_list(texts, 'texts')
    token_ids, rows = inference_inputs.masked_rows(tokenizer, texts, self.model_config.max_len)
    logits = np.asarray(self.logits(token_ids, token_ids != tokenizer.pad_id), np.float64)
    results = inference_inputs.fill_mask_guesses(tokenizer, rows, logits, top_k)
    return results[0] if one else results

  def evaluate(self) -> Dict[str, Any]:
    """The task's metrics on the evaluation data `load(..., with_data=True)` read.

    Returns:
      What `python -m linformer_jax.evaluate` prints, under the names of
      training's eval_results.json: 'step', 'eval_split', 'task', the metrics
      as 'eval_loss', 'eval_accuracy', 'eval_perplexity' (masked LM) ..., and
      the reference model's figure ('unigram_perplexity',
      'majority_class_accuracy').

    Raises:
      ValueError: a run without data (loaded without with_data=True, or built).
    """
    if self.data is None:
      advice = (
          f'load it with linformer_jax.load({self.workdir!r}, with_data=True)'
          if self.workdir
          else 'evaluate a trained run: linformer_jax.load(WORKDIR, with_data=True)'
      )
      raise ValueError(f'This run holds no evaluation data; {advice}.')
    metrics = super().evaluate()
    return {
        'step': self.step,
        'eval_split': self.config.data.eval_split,
        'task': self.parts.task.name,
        **{f'eval_{name}': value for name, value in metrics.items()},
        **self.parts.task.reference_results(self.data),
    }

  def _text_tokenizer(self) -> tokenizer_lib.Tokenizer:
    if self.tokenizer is None:
      raise ValueError(
          f'This run has no tokenizer (config.data.tokenizer={self.config.data.tokenizer!r}); '
          'pass token ids to its methods, or load a trained run.'
      )
    return self.tokenizer

  def _batch(
      self,
      inputs: Inputs,
      padding_mask: Optional[ArrayLike],
      segment_ids: Optional[ArrayLike],
  ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """int32 token ids [batch, length] in the vocabulary, a bool mask and int32
    segment ids (or None) of their shape; texts are encoded first."""
    if inference_inputs.is_text(inputs):
      if padding_mask is not None or segment_ids is not None:
        raise ValueError(
            'Texts are encoded with their own padding mask; give padding_mask and '
            'segment_ids with token ids only.'
        )
      inputs, padding_mask = self.encode(inputs)
    return inference_inputs.checked_batch(
        inputs,
        padding_mask,
        segment_ids,
        vocab_size=self.model_config.vocab_size,
        num_segments=self.model_config.num_segments,
    )

  def _require_encoder(self) -> None:
    """Hidden states and attention are read from the model's 'encoder' (every
    built-in task's model names its encoder so)."""
    if 'encoder' not in self.params:
      raise ValueError(
          f'config.task={self.config.task!r} has a model without an encoder named '
          "'encoder'; use logits()."
      )

  def _variables(self, params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The run's variables, with `params` in place of its parameters if given."""
    if params is None:
      return self.variables
    if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(self.params):
      raise ValueError(
          'params must be shaped as run.params (the same tree: run.params itself, or a '
          'jax.tree_util.tree_map of it).'
      )
    return {**self.variables, 'params': params}

  def _require_attention(self, reader: str) -> None:
    self._require_encoder()
    attention_capture.require_attention_weights(self.model_config, reader)
    self.model_config.require_unscanned(reader)

  def _queries_and_keys(self, batch, params, reader: str):
    _require_concrete(params, reader)
    self._require_attention(reader)
    _, _, queries_and_keys = forward_pass.forward(
        self._variables(params),
        *batch,
        model=self.model,
        config=self.model_config,
        logits=False,
        hidden=None,
        attention=True,
    )
    return queries_and_keys


def _require_concrete(params: Optional[Dict[str, Any]], reader: str) -> None:
  if params is not None and any(
      isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(params)
  ):
    raise ValueError(
        f'{reader} computes P in float64 NumPy, outside JAX, so it takes no traced params; '
        'take gradients through logits() or hidden_states().'
    )


def _prepared(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A complete copy of `config`, its extensions imported and the settings
  they declare added; `config` itself is left as it is."""
  config = run_config.complete(copy.deepcopy(config))
  run_config.expand_paths(config)  # `~` is the home folder, as on the command line
  extensions.import_extensions(config.extensions)
  registry.add_declared_settings(config)
  return config


def load(
    workdir: str,
    step: Optional[int] = None,
    *,
    with_data: bool = False,
    split: Optional[str] = None,
    config: Optional[ml_collections.ConfigDict] = None,
) -> Run:
  """A trained run from its folder alone, or a Hugging Face folder read back.

  A run's folder: the config is the run's own WORKDIR/config.json (its
  extensions imported first, the settings they declare added); the variables
  are a kept checkpoint's, the tokenizer the run's own. Loading only reads
  the folder.

  A Hugging Face masked-LM folder that `Run.save_pretrained` or
  export_checkpoint wrote (its config.json names a model_type) is read as
  import_checkpoint reads it, in memory: the config is the run's own, which
  the folder carries, the variables and the tokenizer the folder's; step 0,
  no workdir. Another Hugging Face folder (a RoBERTa or BERT checkpoint) is
  imported with import_checkpoint first.

  Args:
    workdir: a run's folder (local or gs://), as given to training, or a
      local Hugging Face folder (config.json, model.safetensors,
      tokenizer.json).
    step: a run's kept step; None (or 0) for the newest, the only one a
      Hugging Face folder has. The run's restore_step, which said where
      training resumed from, is not read.
    with_data: also read the evaluation data, for `Run.evaluate`: the split
      config.data.eval_split names (or `split`).
    split: with `with_data`, the split to evaluate on instead: 'validation',
      'test' or 'train'.
    config: read the run with this config instead of its own: other data
      paths or batch size (a field that changes the model is refused); its
      restore_step picks the step unless `step` does. The command `evaluate`
      passes its --config here.

  Raises:
    ConfigError: no config.json, or one of neither kind; no checkpoint, a
      step that is not kept (the message lists the kept ones), a missing
      tokenizer or data, a config of another model, or an extension that
      fails to import; a Hugging Face folder that import_checkpoint refuses
      (a classifier's or causal LM's, another architecture, missing weights
      or tokenizer), or one given a step, data or a config.
  """
  if split is not None and not with_data:
    raise ConfigError(f'split={split!r} names the data to evaluate on; pass with_data=True too.')
  if hf_checkpoint.is_checkpoint_folder(workdir):
    for name, value in (('step', step), ('with_data', with_data), ('config', config)):
      if value:
        raise ConfigError(
            f'{name}={value!r}: {workdir} is a Hugging Face folder, which holds one set of '
            f'weights and no data; load it without {name}, or load the run it was exported '
            'from.'
        )
    return _load_checkpoint_folder(workdir)
  workdir = storage.location(workdir)
  if config is None:
    config = run_builder.saved_config(workdir)
    config.restore_step = 0
  else:
    config = _prepared(config)
  if split is not None:
    config.data.eval_split = split
  loaded = run_loading.load_run(config, workdir, step or None, with_data=with_data)
  return Run(**{field.name: getattr(loaded, field.name) for field in dataclasses.fields(loaded)})


def _load_checkpoint_folder(folder: str) -> Run:
  """A masked-LM folder that `Run.save_pretrained` or export_checkpoint wrote,
  as a `Run` of step 0 and no workdir, read as `hf_import.import_checkpoint`
  reads it, on the run config the folder carries (`hf_export.RUN_CONFIG_KEY`):
  the run's own n, k and settings, the folder's tensors and tokenizer."""
  try:
    checkpoint = hf_checkpoint.read_folder(folder)
    hf_tensors.unused_tensors(checkpoint)  # refuses the tensors of another head
  except hf_checkpoint.FolderError as error:
    raise ConfigError(
        f'linformer_jax.load({folder!r}) reads a Hugging Face folder as a masked LM, as '
        f'import_checkpoint does: {error.reason} For a classifier or causal LM, load the run '
        'it was exported from.'
    ) from None
  if hf_export.RUN_CONFIG_KEY not in checkpoint.config:
    raise ConfigError(
        f'linformer_jax.load({folder!r}): this Hugging Face folder was not exported from a '
        'run (its config.json holds no run config); import it with python -m '
        f'linformer_jax.import_checkpoint --from {folder} --workdir RUN --config '
        'configs/imported.py, then load RUN.'
    )
  saved = checkpoint.config[hf_export.RUN_CONFIG_KEY]
  config = run_builder.config_from_saved(saved, f'{folder}/config.json')
  config.restore_step = 0
  config = hf_conversion.imported_config(config, checkpoint)
  parts = run_builder.build_parts(config)
  variables, _ = hf_import.imported_variables(parts, checkpoint, config.seed)
  return Run(config, parts, variables, checkpoint.tokenizer, 0, None)


def build(config: ml_collections.ConfigDict) -> Run:
  """A fresh model for `config`: the variables a new run of it starts from.

  The config's extensions are imported first and the settings they declare
  added (to a copy: `config` itself is left as it is). The variables are the
  trainer's draw for config.seed; config.init_from is not read.

  Args:
    config: a run config, e.g. configs/tiny.py's get_config().

  Returns:
    A `Run` of step 0 and no workdir. Its tokenizer is the byte tokenizer for
    config.data.tokenizer='byte' and None otherwise: a SentencePiece model is
    trained on the data, which building never reads.

  Raises:
    ConfigError: a bad config, or an extension that fails to import.
  """
  config = _prepared(config)
  parts = run_builder.build_parts(config)
  is_bytes = config.data.tokenizer == 'byte'
  tokenizer = tokenizer_lib.ByteTokenizer() if is_bytes else None
  return Run(config, parts, parts.initial_variables(config.seed), tokenizer, 0, None)


class TrainOutput(NamedTuple):
  """What `train` returns.

  Attributes:
    run: the trained run, as `load(workdir)` reads it.
    results: the final evaluation, as WORKDIR/eval_results.json holds it:
      'step', 'eval_split', 'task', 'eval_loss', 'eval_perplexity', ... (the
      names `Run.evaluate` and the evaluate command give), the reference
      model's figure, 'parameters' and 'wall_time_s'; None when an action
      of `train`'s ended the loop early.
  """

  run: Run
  results: Dict[str, Any]


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    actions: Sequence[loop_actions.PeriodicAction] = (),
) -> TrainOutput:
  """Trains a run to config.total_steps, as `python -m linformer_jax.train` does.

  A run already in `workdir` is resumed from its newest checkpoint (a
  finished one is only evaluated again). The config's extensions are imported
  first (into a copy: `config` itself is left as it is). Progress is printed.

  Args:
    config: a run config, e.g. configs/tiny.py's get_config().
    workdir: the run's folder, local or gs://.
    actions: periodic actions of your own in the training loop
      (`loop_actions.PeriodicAction`, docs/extending.md).

  Returns:
    TrainOutput(run, results): the trained run, loaded, and its final
    evaluation (None when an action ended the loop early).

  Raises:
    ConfigError: a bad config, data or workdir, a workdir of another model,
      or one another run is using.
    NonFiniteLossError: the loss stayed non-finite; the message names the
      kept checkpoints and the flags to go on with.
  """
  results = trainer.train_and_evaluate(_prepared(config), workdir, actions=actions)
  return TrainOutput(load(workdir), results)
