"""Attention kinds, one module per kind, chosen by `config.model.attention`.

  'full'                softmax over every position, the Transformer baseline
                        (full.py)
  'linformer'           keys and values compressed by the sequence projection
                        (linformer.py); its causal form, block by block, is
                        causal_linformer.py
  'linear_transformer'  phi(q) . phi(k) with phi = elu + 1 instead of the
                        softmax, Katharopoulos et al. 2020
                        (linear_transformer.py)
  'performer'           FAVOR+, positive orthogonal random features of the
                        softmax kernel, Choromanski et al. 2021 (performer.py;
                        setting model.performer_features)
  'nystromformer'       softmax through segment-mean landmarks and an iterative
                        pseudo-inverse, Xiong et al. 2021 (nystromformer.py)
  'reformer'            shared-query/key LSH attention in sorted chunks,
                        Kitaev et al. 2020 (reformer.py)
  'longformer'          sliding window plus global tokens, Beltagy et al.
                        2020 (longformer.py)
  'bigbird'             window, global and random key blocks, Zaheer et al.
                        2020 (bigbird.py)
  'sparse_transformer'  the fixed and strided patterns, Child et al. 2019
                        (sparse_transformer.py); the three block-sparse kinds
                        share blocked.py
Each kind is an `AttentionKind` subclass registered under its name (base.py
says what a kind provides: the bidirectional, causal and decoding passes). A
variant of your own is one file that subclasses a kind and registers it,
named in `config.extensions`; it may declare learned parameters (`Parameter`),
fixed arrays (`Constant`) and settings of its own, and gives analyses the
attention weights it applies (`attention_weights`, over the keys and values
its `keys_and_values` records under `ATTENDED`).
"""

import importlib

from linformer_jax.model.attention_kinds.base import ATTENDED
from linformer_jax.model.attention_kinds.base import REGISTRY
from linformer_jax.model.attention_kinds.base import AttentionKind
from linformer_jax.model.attention_kinds.base import Constant
from linformer_jax.model.attention_kinds.base import KeyValueDense
from linformer_jax.model.attention_kinds.base import Parameter
from linformer_jax.model.attention_kinds.base import kind

# The package's own kinds, each in the module of its config name; importing
# one registers it.
BUILT_IN = (
    'full',
    'linformer',
    'linear_transformer',
    'performer',
    'nystromformer',
    'reformer',
    'longformer',
    'bigbird',
    'sparse_transformer',
)
for _name in BUILT_IN:
  importlib.import_module(f'{__name__}.{_name}')

__all__ = [
    'ATTENDED',
    'BUILT_IN',
    'REGISTRY',
    'AttentionKind',
    'Constant',
    'KeyValueDense',
    'Parameter',
    'kind',
]
