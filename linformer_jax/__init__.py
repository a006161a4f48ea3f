"""Linformer (Wang et al., 2020) in JAX/Flax: linear-complexity self-attention.

The Python API (`api.py`, docs/extending.md "The Python API"):

  import linformer_jax

  run = linformer_jax.load(WORKDIR)    # a trained run: config, params, tokenizer, logits
  fresh = linformer_jax.build(config)  # the same for a freshly initialised model

Importing the package stays cheap: `load` and `build` are looked up on first
use, so JAX is not imported before a command has set XLA's flags
(linformer_jax/cli.py).
"""

import importlib
from typing import Any

# Names resolved on first use (PEP 562), from the module that defines them.
_LAZY_EXPORTS = {'load': 'api', 'build': 'api'}


def __getattr__(name: str) -> Any:
  if name in _LAZY_EXPORTS:
    return getattr(importlib.import_module(f'{__name__}.{_LAZY_EXPORTS[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_LAZY_EXPORTS))
