"""The PyTorch form of a model trained with linformer_jax.

LinformerModel is the encoder: token embeddings plus learned positions 0 ..
length-1 (plus segment embeddings, where the model has them), then layers of
self-attention and a GELU MLP, post-LN as RoBERTa (a layer norm after each
residual and after the embeddings) or pre-LN (before each block, and one
after the last layer). Attention is the Linformer's (Wang et al. 2020):
keys and values compressed along the sequence from n positions to k before
the softmax,

  softmax(Q (E^T K)^T / sqrt(d)) (F^T V),

or, with `attention='full'`, the Transformer's. The heads:

  LinformerForMaskedLM                dense, GELU, layer norm, then the token
                                      embedding as decoder, plus a bias
  LinformerForCausalLM                the token embedding as decoder, plus a
                                      bias (a causal model: config.causal)
  LinformerForSequenceClassification  a pooled vector (first token, mean of
                                      the real tokens, or a learned query's
                                      weighted mean), dense, tanh, out_proj

How E and F compress (`config.projection`), over windows of n / k positions
for the windowed kinds:
  'linear', 'random'  matrices [max_len, k] (learned, or fixed: a buffer)
  'mean', 'max'       pooling over the real tokens of each window
  'conv'              a strided convolution, kernel [window, head_dim, head_dim]
and how they are shared (`config.sharing`): one per head and layer ('none',
a leading heads axis), one per layer ('headwise'), E = F per layer ('kv'),
one E = F for the whole model ('layerwise'); k may differ per layer.

Padding never reaches an output that a real token reads: padded keys and
values are zeroed before a projection, a pooling window counts only its real
tokens, and a window (or causal block) holding none is masked out of the
softmax. Rows are padded on the right (`attention_mask` 1, then 0); positions
do not skip padding.

A causal Linformer cuts the sequence into blocks of `block_len` tokens: a
query attends exactly to its own block's tokens up to itself and to the k
compressed slots of every earlier block (a matrix projection maps block i by
its rows i*b .. (i+1)*b - 1; pooling and convolution windows are block_len / k).

This file is remote code: it imports torch and transformers only, and is
loaded with `trust_remote_code=True`.
"""

import math
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import functional
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_outputs import CausalLMOutput
from transformers.modeling_outputs import MaskedLMOutput
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_linformer import LinformerConfig

try:
  from transformers import GenerationMixin
except ImportError:  # transformers before 4.45: every PreTrainedModel generates
  GenerationMixin = object
try:
  # Leaves weights loaded from the folder as they are (transformers 5).
  from transformers import initialization as init
except ImportError:
  from torch.nn import init

MATRIX_PROJECTIONS = ('linear', 'random')


def masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
  """The logits where allowed, else the dtype's lowest finite value: a row
  with every key masked is then uniform, not NaN (in float16 too)."""
  return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)


def zero_padding(x: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
  """x [batch, length, heads, head_dim] with the padded rows zeroed."""
  if padding_mask is None:
    return x
  return torch.where(padding_mask[:, :, None, None], x, torch.zeros_like(x))


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: Optional[torch.Tensor],
    weight_dropout: Optional[nn.Module] = None,
) -> torch.Tensor:
  """Softmax attention: q [batch, queries, heads, head_dim] over k and v
  [batch, keys, heads, head_dim]; key_mask is [batch, keys] or [batch,
  queries, keys], True where a key may be attended to, or None.
  `weight_dropout` drops out the attention weights (in training)."""
  logits = torch.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
  if key_mask is not None:
    mask = key_mask[:, None, None, :] if key_mask.dim() == 2 else key_mask[:, None]
    logits = masked(logits, mask)
  weights = logits.softmax(dim=-1)
  if weight_dropout is not None:
    weights = weight_dropout(weights)
  return torch.einsum('bhqk,bkhd->bqhd', weights, v)


def causal_full_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    padding_mask: Optional[torch.Tensor],
    weight_dropout: Optional[nn.Module] = None,
) -> torch.Tensor:
  """The Transformer's left-to-right attention: position t sees s <= t.

  Every position also sees itself, so a padded query's row is never empty.
  """
  batch, length = q.shape[:2]
  allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()[None]
  if padding_mask is not None:
    itself = torch.eye(length, dtype=torch.bool, device=q.device)[None]
    allowed = allowed & (padding_mask[:, None, :] | itself)
  return attend(q, k, v, allowed.expand(batch, length, length), weight_dropout)


def to_windows(
    x: torch.Tensor, padding_mask: Optional[torch.Tensor], span: int, window: int
) -> Tuple[torch.Tensor, torch.Tensor]:
  """x padded to `span` positions and cut into windows: [batch, span / window,
  window, heads, head_dim], and the mask [batch, span / window, window]."""
  batch, length = x.shape[:2]
  if length > span:
    raise ValueError(f"A sequence of {length} tokens is longer than the model's {span}.")
  if padding_mask is None:
    padding_mask = torch.ones(batch, length, dtype=torch.bool, device=x.device)
  x = functional.pad(x, (0, 0, 0, 0, 0, span - length))
  padding_mask = functional.pad(padding_mask, (0, span - length), value=False)
  windows = span // window
  return x.reshape(batch, windows, window, *x.shape[2:]), padding_mask.reshape(
      batch, windows, window
  )


def compress(
    projection: str,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    *,
    span: int,
    projected_len: int,
    padding_mask: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
  """Keys or values x [batch, length, heads, head_dim] compressed to
  projected_len positions along the sequence.

  Args:
    projection: 'linear', 'random', 'mean', 'max' or 'conv'.
    x: keys or values; length at most span.
    weight: E or F: a matrix [(heads,) span, k], a convolution kernel
      [(heads,) window, head_dim, head_dim], or None for pooling.
    span: the positions the k slots summarise (n).
    projected_len: k.
    padding_mask: [batch, length], True for real tokens, or None.

  Returns:
    [batch, k, heads, head_dim], and [batch, k], False for slots holding no
    real token (None: every slot is attended to).
  """
  if projection in MATRIX_PROJECTIONS:
    rows = weight[..., : x.shape[1], :]
    equation = 'bnhd,nk->bkhd' if rows.dim() == 2 else 'bnhd,hnk->bkhd'
    return torch.einsum(equation, zero_padding(x, padding_mask), rows), None
  windows, window_mask = to_windows(x, padding_mask, span, span // projected_len)
  real = window_mask[..., None, None]
  count = window_mask.sum(dim=2)
  if projection == 'mean':
    total = torch.where(real, windows, torch.zeros_like(windows)).sum(dim=2)
    pooled = total / count.clamp(min=1)[..., None, None]
  elif projection == 'max':
    highest = torch.where(real, windows, torch.full_like(windows, -math.inf)).amax(dim=2)
    pooled = torch.where((count > 0)[..., None, None], highest, torch.zeros_like(highest))
  elif projection == 'conv':
    windows = torch.where(real, windows, torch.zeros_like(windows))
    equation = 'bwjhc,jcd->bwhd' if weight.dim() == 3 else 'bwjhc,hjcd->bwhd'
    pooled = torch.einsum(equation, windows, weight)
  else:
    raise ValueError(f'projection={projection!r} is unknown.')
  return pooled, count > 0


def block_summaries(
    projection: str,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    *,
    block: int,
    slots: int,
    padding_mask: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
  """Each block of x [batch, blocks * block, heads, head_dim] compressed into
  its own `slots` summaries: [batch, blocks * slots, heads, head_dim], slot s
  summarising block s // slots, and their mask, False for slots without a
  real token."""
  batch, length, heads, head_dim = x.shape
  num_blocks = length // block
  if projection in MATRIX_PROJECTIONS:
    rows = weight[..., :length, :].reshape(*weight.shape[:-2], num_blocks, block, slots)
    blocks = zero_padding(x, padding_mask).reshape(batch, num_blocks, block, heads, head_dim)
    equation = 'bnjhd,njs->bnshd' if rows.dim() == 3 else 'bnjhd,hnjs->bnshd'
    summaries = torch.einsum(equation, blocks, rows).reshape(batch, -1, heads, head_dim)
    real_blocks = padding_mask.reshape(batch, num_blocks, block).any(dim=-1)
    return summaries, real_blocks.repeat_interleave(slots, dim=1)
  return compress(
      projection,
      x,
      weight,
      span=length,
      projected_len=num_blocks * slots,
      padding_mask=padding_mask,
  )


def causal_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    padding_mask: Optional[torch.Tensor],
    *,
    projection: str,
    key_weight: Optional[torch.Tensor],
    value_weight: Optional[torch.Tensor],
    block: int,
    slots: int,
    weight_dropout: Optional[nn.Module] = None,
) -> torch.Tensor:
  """The causal Linformer: exact within a block, compressed before it.

  A query in block j attends with one softmax over its block's keys up to
  itself and over the summaries of blocks 0 .. j-1. q, k, v are [batch,
  length, heads, head_dim]; the output is too.
  """
  batch, length, heads, head_dim = q.shape
  if padding_mask is None:
    padding_mask = torch.ones(batch, length, dtype=torch.bool, device=q.device)
  pad = -length % block
  q, k, v = (functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
  padding_mask = functional.pad(padding_mask, (0, pad), value=False)
  common = dict(block=block, slots=slots, padding_mask=padding_mask)
  summary_keys, summary_mask = block_summaries(projection, k, key_weight, **common)
  summary_values, _ = block_summaries(projection, v, value_weight, **common)

  num_blocks = q.shape[1] // block
  by_block = lambda x: x.reshape(batch, num_blocks, block, heads, head_dim)
  scale = 1.0 / math.sqrt(head_dim)
  causal = torch.ones(block, block, dtype=torch.bool, device=q.device).tril()
  # [batch, blocks, 1 (heads), queries, keys]
  block_mask = (causal[None, None] & padding_mask.reshape(batch, num_blocks, 1, block))[:, :, None]
  slot_block = torch.arange(summary_keys.shape[1], device=q.device) // slots
  earlier = slot_block[None, :] < torch.arange(num_blocks, device=q.device)[:, None]
  # [batch, blocks, 1 (heads), 1 (queries), slots]
  visible = (summary_mask[:, None, :] & earlier[None])[:, :, None, None, :]
  block_logits = torch.einsum('bnqhd,bnkhd->bnhqk', by_block(q), by_block(k)) * scale
  summary_logits = torch.einsum('bnqhd,bshd->bnhqs', by_block(q), summary_keys) * scale
  logits = torch.cat(
      [masked(block_logits, block_mask), masked(summary_logits, visible)],
      dim=-1,
  )
  weights = logits.softmax(dim=-1)
  if weight_dropout is not None:
    weights = weight_dropout(weights)
  # A padded query sees no key; zeroing the masked weights keeps its row causal too.
  block_weights = weights[..., :block].masked_fill(~block_mask, 0.0)
  summary_weights = weights[..., block:].masked_fill(~visible, 0.0)
  out = torch.einsum('bnhqk,bnkhd->bnqhd', block_weights, by_block(v))
  out = out + torch.einsum('bnhqs,bshd->bnqhd', summary_weights, summary_values)
  return out.reshape(batch, num_blocks * block, heads, head_dim)[:, :length]


class LinformerProjection(nn.Module):
  """The E and F of a layer, or of the whole model (sharing='layerwise').

  Weights are named `kv_projection` (E = F) or `key_projection` and
  `value_projection`; 'random' ones are buffers, saved but never trained;
  pooling has none.
  """

  def __init__(self, config: LinformerConfig, projected_len: int, per_head: bool, shared: bool):
    super().__init__()
    self.projection = config.projection
    self.projected_len = projected_len
    self.shared = shared
    heads = (config.num_attention_heads,) if per_head else ()
    head_dim = config.hidden_size // config.num_attention_heads
    window = config.compressed_span // projected_len
    if config.projection in MATRIX_PROJECTIONS:
      shape = heads + (config.max_position_embeddings, projected_len)
    elif config.projection == 'conv':
      shape = heads + (window, head_dim, head_dim)
    else:
      shape = None
    self.names = (
        ()
        if shape is None
        else ('kv_projection',)
        if shared
        else ('key_projection', 'value_projection')
    )
    for name in self.names:
      if config.projection == 'random':
        self.register_buffer(name, torch.empty(shape), persistent=True)
      else:
        setattr(self, name, nn.Parameter(torch.empty(shape)))

  def forward(self) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(E, F); the same tensor when shared, None for pooling."""
    if not self.names:
      return None, None
    if self.shared:
      return self.kv_projection, self.kv_projection
    return self.key_projection, self.value_projection


class LinformerSelfAttention(nn.Module):
  """Queries, keys and values, and attention of the configured kind."""

  def __init__(self, config: LinformerConfig, layer: int):
    super().__init__()
    self.config = config
    self.num_heads = config.num_attention_heads
    self.head_dim = config.hidden_size // config.num_attention_heads
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)
    self.value = nn.Linear(config.hidden_size, config.hidden_size)
    self.projected_len = config.projected_len_for_layer(layer)
    self.weight_dropout = nn.Dropout(config.attention_probs_dropout_prob)
    if config.attention == 'linformer' and config.sharing != 'layerwise':
      self.projection = LinformerProjection(
          config,
          self.projected_len,
          per_head=config.sharing == 'none',
          shared=config.sharing == 'kv',
      )

  def forward(self, x, padding_mask, shared_weights):
    """x [batch, length, hidden] -> [batch, length, hidden], before the output dense."""
    batch, length = x.shape[:2]
    heads = lambda dense: dense(x).reshape(batch, length, self.num_heads, self.head_dim)
    q, k, v = heads(self.query), heads(self.key), heads(self.value)
    config = self.config
    if config.attention == 'full':
      if config.causal:
        out = causal_full_attention(q, k, v, padding_mask, self.weight_dropout)
      else:
        out = attend(q, k, v, padding_mask, self.weight_dropout)
    else:
      key_weight, value_weight = (
          shared_weights if config.sharing == 'layerwise' else self.projection()
      )
      if config.causal:
        out = causal_block_attention(
            q,
            k,
            v,
            padding_mask,
            projection=config.projection,
            key_weight=key_weight,
            value_weight=value_weight,
            block=config.block_len,
            slots=self.projected_len,
            weight_dropout=self.weight_dropout,
        )
      else:
        common = dict(
            span=config.max_position_embeddings,
            projected_len=self.projected_len,
            padding_mask=padding_mask,
        )
        keys, key_mask = compress(config.projection, k, key_weight, **common)
        values, _ = compress(config.projection, v, value_weight, **common)
        out = attend(q, keys, values, key_mask, self.weight_dropout)
    return out.reshape(batch, length, config.hidden_size)


class LinformerSelfOutput(nn.Module):
  """The attention's output dense layer, and the layer norm of its block."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)


class LinformerAttention(nn.Module):
  """Self-attention (`self`) and its output (`output`), as RoBERTa names them."""

  def __init__(self, config: LinformerConfig, layer: int):
    super().__init__()
    self.self = LinformerSelfAttention(config, layer)
    self.output = LinformerSelfOutput(config)

  def forward(self, x, padding_mask, shared_weights):
    """The block's residual branch: attention, output dense, dropout."""
    return self.output.dropout(self.output.dense(self.self(x, padding_mask, shared_weights)))


class LinformerIntermediate(nn.Module):
  """The MLP's first dense layer."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
    self.dropout = nn.Dropout(config.activation_dropout)


class LinformerOutput(nn.Module):
  """The MLP's second dense layer, and the layer norm of its block."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)


class LinformerLayer(nn.Module):
  """Attention and MLP blocks with residuals, post-LN or pre-LN.

  Post-LN: x = norm(x + block(x)). Pre-LN: x = x + block(norm(x)), with the
  same two norms (`attention.output.LayerNorm`, `output.LayerNorm`).
  """

  def __init__(self, config: LinformerConfig, layer: int):
    super().__init__()
    self.pre_layer_norm = config.pre_layer_norm
    self.attention = LinformerAttention(config, layer)
    self.intermediate = LinformerIntermediate(config)
    self.output = LinformerOutput(config)

  def mlp(self, x):
    h = self.intermediate.dropout(functional.gelu(self.intermediate.dense(x)))
    return self.output.dropout(self.output.dense(h))

  def forward(self, x, padding_mask, shared_weights):
    attention_norm, mlp_norm = self.attention.output.LayerNorm, self.output.LayerNorm
    if self.pre_layer_norm:
      x = x + self.attention(attention_norm(x), padding_mask, shared_weights)
      return x + self.mlp(mlp_norm(x))
    x = attention_norm(x + self.attention(x, padding_mask, shared_weights))
    return mlp_norm(x + self.mlp(x))


class LinformerEmbeddings(nn.Module):
  """Token, position and segment embeddings (post-LN: then a layer norm)."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
    self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
    self.type_vocab_size = config.type_vocab_size
    if config.type_vocab_size:
      self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
    if not config.pre_layer_norm:
      self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, input_ids, token_type_ids=None):
    length = input_ids.shape[1]
    if length > self.position_embeddings.num_embeddings:
      raise ValueError(
          f"Input length {length} is longer than the model's "
          f'{self.position_embeddings.num_embeddings} positions; truncate it.'
      )
    x = self.word_embeddings(input_ids) + self.position_embeddings.weight[None, :length]
    if self.type_vocab_size == 1:  # one token type, added to every token (RoBERTa's)
      x = x + self.token_type_embeddings.weight[0]
    elif self.type_vocab_size:
      if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
      x = x + self.token_type_embeddings(token_type_ids)
    if hasattr(self, 'LayerNorm'):
      x = self.LayerNorm(x)
    return self.dropout(x)


class LinformerEncoder(nn.Module):
  """The layers, the model's shared projection (sharing='layerwise') and,
  pre-LN, the final layer norm."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.layer = nn.ModuleList(
        [LinformerLayer(config, layer) for layer in range(config.num_hidden_layers)]
    )
    if config.attention == 'linformer' and config.sharing == 'layerwise':
      self.shared_projection = LinformerProjection(
          config, config.projected_len_for_layer(0), per_head=False, shared=True
      )
    if config.pre_layer_norm:
      self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

  def forward(self, x, padding_mask, output_hidden_states=False):
    shared = self.shared_projection() if hasattr(self, 'shared_projection') else (None, None)
    hidden_states = [x]
    for layer in self.layer:
      x = layer(x, padding_mask, shared)
      hidden_states.append(x)
    if hasattr(self, 'final_norm'):
      x = self.final_norm(x)
      hidden_states[-1] = x
    return x, tuple(hidden_states) if output_hidden_states else None


class LinformerPreTrainedModel(PreTrainedModel):
  """Weights and their initialisation for a model that is not loaded."""

  config_class = LinformerConfig
  base_model_prefix = 'linformer'

  def _init_weights(self, module):
    super()._init_weights(module)
    if isinstance(module, LinformerProjection):
      for name in module.names:
        weight = getattr(module, name)
        if module.projection in MATRIX_PROJECTIONS:  # the Johnson-Lindenstrauss N(0, 1/k)
          init.normal_(weight, mean=0.0, std=module.projected_len**-0.5)
        else:  # conv: fan-in over the window and the input features
          init.normal_(weight, mean=0.0, std=(weight.shape[-3] * weight.shape[-2]) ** -0.5)
    elif isinstance(module, (LinformerLMHead, LinformerCausalLMHead)):
      init.zeros_(module.bias)
    elif isinstance(module, LinformerClassificationHead) and hasattr(module, 'pool_query'):
      init.zeros_(module.pool_query)


class LinformerModel(LinformerPreTrainedModel):
  """The encoder: [batch, length] token ids to [batch, length, hidden_size]."""

  def __init__(self, config: LinformerConfig):
    super().__init__(config)
    self.embeddings = LinformerEmbeddings(config)
    self.encoder = LinformerEncoder(config)
    self.post_init()

  def get_input_embeddings(self):
    return self.embeddings.word_embeddings

  def set_input_embeddings(self, value):
    self.embeddings.word_embeddings = value

  def forward(
      self,
      input_ids: torch.Tensor,
      attention_mask: Optional[torch.Tensor] = None,
      token_type_ids: Optional[torch.Tensor] = None,
      output_hidden_states: Optional[bool] = None,
      return_dict: Optional[bool] = None,
      **kwargs,
  ):
    """Encodes right-padded rows; attention_mask is 1 for real tokens."""
    del kwargs  # e.g. position_ids: positions are always 0 .. length-1
    padding_mask = None if attention_mask is None else attention_mask.bool()
    x = self.embeddings(input_ids, token_type_ids)
    x, hidden_states = self.encoder(x, padding_mask, bool(output_hidden_states))
    output = BaseModelOutput(last_hidden_state=x, hidden_states=hidden_states)
    return output if return_dict is not False else output.to_tuple()


class LinformerLMHead(nn.Module):
  """The masked-LM head: dense, GELU, layer norm, then the token embedding
  as decoder, plus a bias."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.bias = nn.Parameter(torch.zeros(config.vocab_size))

  def forward(self, hidden, token_embedding):
    h = self.layer_norm(functional.gelu(self.dense(hidden)))
    return functional.linear(h, token_embedding) + self.bias


class LinformerCausalLMHead(nn.Module):
  """The causal LM's output: the token embedding as decoder, plus a bias."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.bias = nn.Parameter(torch.zeros(config.vocab_size))

  def forward(self, hidden, token_embedding):
    return functional.linear(hidden, token_embedding) + self.bias


class LinformerClassificationHead(nn.Module):
  """A pooled vector, then dense, tanh, dropout and out_proj."""

  def __init__(self, config: LinformerConfig):
    super().__init__()
    self.pooling = config.pooling
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)
    self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
    if config.pooling == 'attention':
      self.pool_query = nn.Parameter(torch.zeros(config.hidden_size))

  def pool(self, hidden, padding_mask):
    """[batch, length, hidden] -> [batch, hidden]: the first token, the mean of
    the real tokens, or their softmax(hidden . pool_query / sqrt(d))-weighted mean."""
    if self.pooling == 'first':
      return hidden[:, 0]
    if padding_mask is None:
      padding_mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    if self.pooling == 'mean':
      weights = padding_mask.to(hidden.dtype)
      total = torch.einsum('bl,bld->bd', weights, hidden)
      return total / weights.sum(dim=1, keepdim=True).clamp(min=1.0)
    scores = torch.einsum('bld,d->bl', hidden, self.pool_query) / math.sqrt(hidden.shape[-1])
    weights = masked(scores, padding_mask).softmax(dim=-1)
    return torch.einsum('bl,bld->bd', weights, hidden)

  def forward(self, hidden, padding_mask):
    h = self.dropout(torch.tanh(self.dense(self.pool(hidden, padding_mask))))
    return self.out_proj(h)


class LinformerForMaskedLM(LinformerPreTrainedModel):
  """The encoder with the masked-LM head; logits [batch, length, vocab_size]."""

  def __init__(self, config: LinformerConfig):
    super().__init__(config)
    self.linformer = LinformerModel(config)
    self.lm_head = LinformerLMHead(config)
    self.post_init()

  def forward(
      self,
      input_ids: torch.Tensor,
      attention_mask: Optional[torch.Tensor] = None,
      token_type_ids: Optional[torch.Tensor] = None,
      labels: Optional[torch.Tensor] = None,
      output_hidden_states: Optional[bool] = None,
      return_dict: Optional[bool] = None,
      **kwargs,
  ):
    """labels: token ids to predict, -100 where none (the loss is their mean)."""
    encoded = self.linformer(
        input_ids, attention_mask, token_type_ids, output_hidden_states, return_dict=True
    )
    token_embedding = self.linformer.embeddings.word_embeddings.weight
    logits = self.lm_head(encoded.last_hidden_state, token_embedding)
    loss = None
    if labels is not None:
      loss = functional.cross_entropy(
          logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
      )
    output = MaskedLMOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states)
    return output if return_dict is not False else output.to_tuple()


class LinformerForCausalLM(LinformerPreTrainedModel, GenerationMixin):
  """A left-to-right model (config.causal) with the token embedding as its
  output layer; logits [batch, length, vocab_size] predict the next token.

  `generate` recomputes the whole prefix at every token (no cache), up to
  max_position_embeddings tokens; pad on the right.
  """

  def __init__(self, config: LinformerConfig):
    super().__init__(config)
    if not config.causal:
      raise ValueError('LinformerForCausalLM needs a causal model (config.causal=True).')
    self.linformer = LinformerModel(config)
    self.lm_head = LinformerCausalLMHead(config)
    self.post_init()

  def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
    del kwargs
    return {'input_ids': input_ids, 'attention_mask': attention_mask}

  def forward(
      self,
      input_ids: torch.Tensor,
      attention_mask: Optional[torch.Tensor] = None,
      labels: Optional[torch.Tensor] = None,
      output_hidden_states: Optional[bool] = None,
      return_dict: Optional[bool] = None,
      **kwargs,
  ):
    """labels: the input ids (shifted here), -100 where nothing is predicted."""
    del kwargs  # e.g. use_cache: there is no cache
    encoded = self.linformer(
        input_ids, attention_mask, None, output_hidden_states, return_dict=True
    )
    token_embedding = self.linformer.embeddings.word_embeddings.weight
    logits = self.lm_head(encoded.last_hidden_state, token_embedding)
    loss = None
    if labels is not None:
      loss = functional.cross_entropy(
          logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
      )
    output = CausalLMOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states)
    return output if return_dict is not False else output.to_tuple()


class LinformerForSequenceClassification(LinformerPreTrainedModel):
  """The encoder with a classification head; logits [batch, num_labels]."""

  def __init__(self, config: LinformerConfig):
    super().__init__(config)
    self.num_labels = config.num_labels
    self.linformer = LinformerModel(config)
    self.classifier = LinformerClassificationHead(config)
    self.post_init()

  def forward(
      self,
      input_ids: torch.Tensor,
      attention_mask: Optional[torch.Tensor] = None,
      token_type_ids: Optional[torch.Tensor] = None,
      labels: Optional[torch.Tensor] = None,
      output_hidden_states: Optional[bool] = None,
      return_dict: Optional[bool] = None,
      **kwargs,
  ):
    """labels: class indices (a float target when num_labels is 1: regression)."""
    del kwargs
    encoded = self.linformer(
        input_ids, attention_mask, token_type_ids, output_hidden_states, return_dict=True
    )
    padding_mask = None if attention_mask is None else attention_mask.bool()
    logits = self.classifier(encoded.last_hidden_state, padding_mask)
    loss = None
    if labels is not None:
      if self.num_labels == 1:
        loss = functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
      else:
        loss = functional.cross_entropy(logits, labels)
    output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states)
    return output if return_dict is not False else output.to_tuple()
