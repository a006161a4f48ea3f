"""The Python API: a trained run, or a fresh model, in one line.

  import linformer_jax

  run = linformer_jax.load('/tmp/tiny')           # the newest kept checkpoint
  token_ids, padding_mask = run.encode(['def main():', 'import os'])
  logits = run.logits(token_ids, padding_mask)    # the task head's output

  fresh = linformer_jax.build(config)             # initialised as a new run of config
  run.save_pretrained('/tmp/tiny_hf')             # a folder transformers loads
  read_back = linformer_jax.load('/tmp/tiny_hf')  # a Hugging Face masked-LM folder, at step 0

`load` and `build` give the same `Run`: the run's config, model, variables
and tokenizer, and the passes a researcher reaches for (`logits`,
`hidden_states`, `attention`) and the export to a Hugging Face folder
(`save_pretrained`). Both build through the training code's own path
(`training.run_builder.build_parts`, `training.run_loading.load_run`),
and both import the config's `extensions` first, so a run of a projection or
attention kind of your own loads as a built-in one does. `load` of a Hugging
Face folder reads it as import_checkpoint does (`training.hf_import`), in
memory.

The package exports `load` and `build` lazily (linformer_jax/__init__.py):
importing linformer_jax does not import JAX, so the commands can set XLA's
flags first.
"""

import copy
import dataclasses
import functools
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import jax
import ml_collections
import numpy as np

from linformer_jax import extensions
from linformer_jax import registry
from linformer_jax.checkpoints import hf_checkpoint
from linformer_jax.checkpoints import hf_conversion
from linformer_jax.checkpoints import hf_export
from linformer_jax.checkpoints import hf_tensors
from linformer_jax.data import encoding
from linformer_jax.data import tokenizer as tokenizer_lib
from linformer_jax.errors import ConfigError
from linformer_jax.model import attention_capture
from linformer_jax.model import layers
from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.training import hf_import
from linformer_jax.training import run_builder
from linformer_jax.training import run_config
from linformer_jax.training import run_loading

ArrayLike = Union[jax.Array, np.ndarray, Sequence[Sequence[int]]]


class LayerAttention(NamedTuple):
  """What one layer attends with, on a batch (`Run.attention`).

  Attributes:
    probabilities: float64 [batch, heads, n, keys], P = softmax(Q K^T /
      sqrt(d)): each real query's row sums to 1 over the keys it may attend
      to; a padded query's row is zero.
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


@dataclasses.dataclass(eq=False)
class Run(run_loading.LoadedRun):
  """A model with its variables: a kept checkpoint (`load`) or a fresh draw
  (`build`), in the one shape every reader of a run gets
  (`training.run_loading.LoadedRun`: config, parts, variables, tokenizer,
  step, workdir, data), with the methods a researcher calls.
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

  def encode(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Texts as rows the model reads: `[bos] text [eos]`, cut to max_len and padded.

    Args:
      texts: a list of strings, one row each.

    Returns:
      (token_ids int32 [len(texts), max_len], padding_mask bool [len(texts),
      max_len], True for real tokens).

    Raises:
      ValueError: a single string instead of a list, or a run without a tokenizer.
    """
    if isinstance(texts, str):
      raise ValueError('encode takes a list of texts; pass [text] for one.')
    if self.tokenizer is None:
      raise ValueError(
          f'This run has no tokenizer (config.data.tokenizer={self.config.data.tokenizer!r}); '
          'pass token ids to its methods, or load a trained run.'
      )
    max_len = self.model_config.max_len
    rows = [encoding.encode_texts([text], self.tokenizer, max_len)[0] for text in texts]
    token_ids = np.full((len(rows), max_len), self.tokenizer.pad_id, np.int32)
    padding_mask = np.zeros((len(rows), max_len), bool)
    for row, ids in enumerate(rows):
      token_ids[row, : len(ids)] = ids
      padding_mask[row, : len(ids)] = True
    return token_ids, padding_mask

  def logits(self, token_ids: ArrayLike, padding_mask: Optional[ArrayLike] = None) -> jax.Array:
    """The output of the run's task head, in inference mode (no dropout).

    Args:
      token_ids: int [batch, length], length at most config.model.max_len.
      padding_mask: bool [batch, length], True for real tokens; None: all real.

    Returns:
      float32 masked-LM or causal-LM logits [batch, length, vocab_size], or
      classifier logits [batch, num_classes].
    """
    token_ids, padding_mask = self._checked(token_ids, padding_mask)
    return _task_logits(self.model, self.variables, token_ids, padding_mask)

  def hidden_states(
      self,
      token_ids: ArrayLike,
      padding_mask: Optional[ArrayLike] = None,
      *,
      per_layer: bool = False,
  ) -> Union[jax.Array, List[jax.Array]]:
    """The encoder's output, what the task head reads.

    Args:
      token_ids: int [batch, length], length at most config.model.max_len.
      padding_mask: bool [batch, length], True for real tokens; None: all real.
      per_layer: instead, the output of every encoder layer (with
        model.pre_layer_norm, the last one before the final layer norm).

    Returns:
      [batch, length, hidden_dim] in the compute dtype; with `per_layer` a
      list of num_layers of them.

    Raises:
      ConfigError: `per_layer` for a model with scanned layers.
    """
    if per_layer:
      self.model_config.require_unscanned('hidden_states(per_layer=True)')
    token_ids, padding_mask = self._checked(token_ids, padding_mask)
    hidden, per_layer_hidden = _encoder_outputs(
        self.model_config, self._encoder_variables(), token_ids, padding_mask, per_layer
    )
    return per_layer_hidden if per_layer else hidden

  def attention(
      self, token_ids: ArrayLike, layer: int, padding_mask: Optional[ArrayLike] = None
  ) -> LayerAttention:
    """A layer's attention probabilities P, queries and the keys P is over.

    P is softmax(Q K^T / sqrt(d)) in float64, computed from the queries and
    keys the layer computed in the pass (`model.attention_capture`), over the
    k compressed keys for the Linformer and the n keys for the Transformer.

    Args:
      token_ids: int [batch, length], length at most config.model.max_len.
      layer: the layer, 0 to num_layers - 1.
      padding_mask: bool [batch, length], True for real tokens; None: all real.

    Raises:
      ValueError: a layer out of range.
      ConfigError: a causal model, scanned layers, or an attention kind that
        weighs its keys otherwise (`attention_capture.require_plain_softmax`).
    """
    config = self.model_config
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < config.num_layers:
      raise ValueError(f'layer={layer!r}: use a layer from 0 to {config.num_layers - 1}.')
    attention_capture.require_plain_softmax(config, 'attention()')
    config.require_unscanned('attention()')
    token_ids, padding_mask = self._checked(token_ids, padding_mask)
    queries, keys, key_mask = _queries_and_keys(
        config, self._encoder_variables(), token_ids, padding_mask
    )[layer]
    probabilities = attention_capture.attention_matrix(
        np.asarray(queries), np.asarray(keys), key_mask, np.asarray(padding_mask)
    )
    return LayerAttention(probabilities, queries, keys, key_mask)

  def _checked(
      self, token_ids: ArrayLike, padding_mask: Optional[ArrayLike]
  ) -> Tuple[np.ndarray, np.ndarray]:
    """int32 token ids [batch, length] in the vocabulary, and a bool mask of their shape."""
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
      raise ValueError(
          f'token_ids must be integers [batch, length], not {token_ids.dtype} of shape '
          f'{token_ids.shape}; add a batch axis (token_ids[None]) for one sequence.'
      )
    vocab_size = self.model_config.vocab_size
    if token_ids.size and not 0 <= token_ids.min() <= token_ids.max() < vocab_size:
      raise ValueError(
          f'token_ids hold {token_ids.min()}..{token_ids.max()}; the vocabulary is 0 to '
          f'{vocab_size - 1}.'
      )
    if padding_mask is None:
      return token_ids.astype(np.int32), np.ones(token_ids.shape, bool)
    padding_mask = np.asarray(padding_mask)
    if padding_mask.shape != token_ids.shape:
      raise ValueError(
          f"padding_mask has shape {padding_mask.shape}; give token_ids' {token_ids.shape}."
      )
    return token_ids.astype(np.int32), padding_mask.astype(bool)

  def _encoder_variables(self) -> Dict[str, Any]:
    """The variables of the model's encoder (every built-in task's model names it 'encoder')."""
    if 'encoder' not in self.params:
      raise ValueError(
          f'config.task={self.config.task!r} has a model without an encoder named '
          "'encoder'; use logits()."
      )
    return {name: tree['encoder'] for name, tree in self.variables.items() if 'encoder' in tree}


# The passes, jitted once per model (Flax modules and ModelConfig hash by
# value): runs of one config share their compiled programs.


@functools.partial(jax.jit, static_argnums=0)
def _task_logits(model, variables, token_ids, padding_mask):
  return model.apply(variables, token_ids, padding_mask, deterministic=True)


def _is_encoder_layer(module: Any, method_name: str) -> bool:
  return method_name == '__call__' and isinstance(module, layers.EncoderLayer)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _encoder_outputs(config: ModelConfig, variables, token_ids, padding_mask, per_layer: bool):
  """(the encoder's output, each layer's output or None)."""
  encoder = models.Encoder(config)
  if not per_layer:
    return encoder.apply(variables, token_ids, padding_mask, deterministic=True), None
  out, state = encoder.apply(
      variables,
      token_ids,
      padding_mask,
      deterministic=True,
      capture_intermediates=_is_encoder_layer,
      mutable=['intermediates'],
  )
  captured = state['intermediates']
  return out, [captured[f'layers_{i}']['__call__'][0] for i in range(config.num_layers)]


@functools.partial(jax.jit, static_argnums=0)
def _queries_and_keys(config: ModelConfig, variables, token_ids, padding_mask):
  """Per layer (queries, keys, key_mask), as `attention_capture` reads them."""
  encoder = attention_capture.apply_capturing(
      models.Encoder(config), variables, token_ids, padding_mask
  )
  return attention_capture.context_queries_and_keys({'encoder': encoder}, config, padding_mask)


def load(workdir: str, step: Optional[int] = None) -> Run:
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
      Hugging Face folder has. The config's restore_step, which said where
      training resumed from, is set to 0.

  Raises:
    ConfigError: no config.json, or one of neither kind; no checkpoint, a
      step that is not kept (the message lists the kept ones), a missing
      tokenizer, or an extension that fails to import; a Hugging Face folder
      that import_checkpoint refuses (a classifier's or causal LM's, another
      architecture, missing weights or tokenizer) or a step with one.
  """
  if hf_checkpoint.is_checkpoint_folder(workdir):
    if step:
      raise ConfigError(
          f'step={step}: {workdir} is a Hugging Face folder, which holds one set of weights; '
          'load it without step.'
      )
    return _load_checkpoint_folder(workdir)
  config = run_builder.saved_config(workdir)
  config.restore_step = 0
  loaded = run_loading.load_run(config, workdir, step or None)
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
  config = run_config.complete(copy.deepcopy(config))
  extensions.import_extensions(config.extensions)
  registry.add_declared_settings(config)
  parts = run_builder.build_parts(config)
  is_bytes = config.data.tokenizer == 'byte'
  tokenizer = tokenizer_lib.ByteTokenizer() if is_bytes else None
  return Run(config, parts, parts.initial_variables(config.seed), tokenizer, 0, None)
