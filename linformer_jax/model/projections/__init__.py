"""Sequence projections (the paper's E and F), one module per kind.

`config.model.projection` names one of `REGISTRY.names()`:
  'linear'  learned matrices [max_len, k]            (linear.py)
  'random'  fixed random matrices, never trained     (random.py)
  'mean'    average pooling, window max_len / k      (mean.py)
  'max'     max pooling, window max_len / k          (max.py)
  'conv'    learned strided convolution              (conv.py)
Each module holds its kind's math as pure functions and a
`SequenceProjectionKind` subclass registered under its name (base.py says
what a kind declares; its weight is a `Parameter` or a `Constant`, which the
layer creates). A projection of your own is one file that subclasses
`SequenceProjectionKind` and registers it, named in `config.extensions`.
"""

import importlib

from linformer_jax.model.declarations import CONSTANTS
from linformer_jax.model.declarations import Constant
from linformer_jax.model.declarations import Parameter
from linformer_jax.model.projections.base import REGISTRY
from linformer_jax.model.projections.base import LayerProjection
from linformer_jax.model.projections.base import SequenceProjectionKind
from linformer_jax.model.projections.base import kind

# The package's own kinds, each in the module of its config name; importing
# one registers it.
BUILT_IN = ('linear', 'mean', 'max', 'conv', 'random')
for _name in BUILT_IN:
  importlib.import_module(f'{__name__}.{_name}')

__all__ = [
    'BUILT_IN',
    'CONSTANTS',
    'REGISTRY',
    'Constant',
    'LayerProjection',
    'Parameter',
    'SequenceProjectionKind',
    'kind',
]
