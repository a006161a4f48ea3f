"""LinformerConfig: the settings of a model exported by linformer_jax.

The fields that every encoder has keep the names `transformers` gives them
(hidden_size, num_hidden_layers, ...); the Linformer's own keep the names of
linformer_jax's `config.model` (attention, projected_len, sharing, projection,
...), so that a folder reads back into a run field by field.

This file is remote code: it imports transformers only, and is loaded with
`trust_remote_code=True`.
"""

from transformers import PretrainedConfig

ATTENTION_KINDS = ('linformer', 'full')
SHARING_MODES = ('none', 'headwise', 'kv', 'layerwise')
PROJECTIONS = ('linear', 'random', 'mean', 'max', 'conv')
POOLING_TYPES = ('first', 'mean', 'attention')


class LinformerConfig(PretrainedConfig):
  """The settings of a Linformer (or a Transformer of the same code).

  Args:
    vocab_size: tokens in the vocabulary.
    hidden_size: the width d_model.
    num_hidden_layers: encoder layers.
    num_attention_heads: heads per layer; hidden_size is a multiple of it.
    intermediate_size: the MLP's hidden width.
    max_position_embeddings: n, the longest sequence (positions are learned).
    type_vocab_size: segment embeddings: 0 none, 1 one row added to every
      token (RoBERTa's), 2 or more chosen by token_type_ids.
    layer_norm_eps: the layer norms' epsilon.
    hidden_dropout_prob: dropout after the embeddings and on each residual
      branch (the attention output, the MLP output).
    attention_probs_dropout_prob: dropout on the attention weights.
    activation_dropout: dropout on the MLP's GELU output.
    initializer_range: the standard deviation of new dense weights.
    attention: 'linformer' (keys and values compressed to k positions) or
      'full' (the Transformer).
    projected_len: k, one int or one per layer (a causal model: the slots
      each block of block_len tokens is compressed into).
    sharing: the projections E and F: one per head and layer ('none'), one
      per layer ('headwise'), E = F per layer ('kv'), or one E = F for the
      whole model ('layerwise').
    projection: how keys and values are compressed: learned matrices
      ('linear'), fixed random matrices ('random'), mean or max pooling
      ('mean', 'max') or a strided convolution ('conv'), over windows of
      n / k positions.
    projection_init, projection_init_noise: how linformer_jax initialised
      the projection (recorded for reading the folder back).
    causal: left-to-right attention (a language model).
    block_len: a causal Linformer's block: exact attention within it, the k
      compressed slots of each earlier block before it.
    pre_layer_norm: layer norms before each block (and after the last
      layer) instead of after each residual (RoBERTa's post-LN).
    pooling: what a classifier reads: the 'first' token, the 'mean' of the
      real tokens, or an 'attention'-weighted mean (a learned query).
  """

  model_type = 'linformer'

  def __init__(
      self,
      vocab_size=260,
      hidden_size=768,
      num_hidden_layers=12,
      num_attention_heads=12,
      intermediate_size=3072,
      max_position_embeddings=512,
      type_vocab_size=0,
      layer_norm_eps=1e-5,
      hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1,
      activation_dropout=0.0,
      initializer_range=0.02,
      attention='linformer',
      projected_len=128,
      sharing='layerwise',
      projection='linear',
      projection_init='jl',
      projection_init_noise=0.0,
      causal=False,
      block_len=64,
      pre_layer_norm=False,
      pooling='first',
      hidden_act='gelu',
      pad_token_id=0,
      bos_token_id=1,
      eos_token_id=2,
      tie_word_embeddings=True,
      **kwargs,
  ):
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.layer_norm_eps = layer_norm_eps
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.activation_dropout = activation_dropout
    self.initializer_range = initializer_range
    self.attention = attention
    self.projected_len = (
        list(projected_len) if isinstance(projected_len, (list, tuple)) else projected_len
    )
    self.sharing = sharing
    self.projection = projection
    self.projection_init = projection_init
    self.projection_init_noise = projection_init_noise
    self.causal = causal
    self.block_len = block_len
    self.pre_layer_norm = pre_layer_norm
    self.pooling = pooling
    self.hidden_act = hidden_act
    super().__init__(
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
        **kwargs,
    )
    self.is_decoder = causal  # after the base class, which sets its own default
    self._check()

  def projected_len_for_layer(self, layer: int) -> int:
    """k of one layer (the slots per block, when causal)."""
    if isinstance(self.projected_len, list):
      return self.projected_len[layer]
    return self.projected_len

  @property
  def compressed_span(self) -> int:
    """The positions one compression covers: n, or a causal Linformer's block."""
    if self.causal and self.attention == 'linformer':
      return self.block_len
    return self.max_position_embeddings

  def _check(self) -> None:
    choices = (
        ('attention', ATTENTION_KINDS),
        ('sharing', SHARING_MODES),
        ('projection', PROJECTIONS),
        ('pooling', POOLING_TYPES),
        ('hidden_act', ('gelu',)),
    )
    for field, allowed in choices:
      if getattr(self, field) not in allowed:
        raise ValueError(f'{field}={getattr(self, field)!r} is not one of {allowed}.')
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f'hidden_size={self.hidden_size} must be a multiple of '
          f'num_attention_heads={self.num_attention_heads}.'
      )
    lengths = self.projected_len if isinstance(self.projected_len, list) else None
    if lengths is not None and len(lengths) != self.num_hidden_layers:
      raise ValueError(
          f'projected_len={lengths} gives {len(lengths)} layers a k; the model has '
          f'{self.num_hidden_layers}.'
      )
    if self.compressed_span != self.max_position_embeddings and (
        self.max_position_embeddings % self.block_len
    ):
      raise ValueError(
          f'block_len={self.block_len} must divide max_position_embeddings='
          f'{self.max_position_embeddings}.'
      )
