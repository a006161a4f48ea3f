"""Linformer (Wang et al., 2020) in JAX/Flax: linear-complexity self-attention.

The Python API (`api.py`, docs/api.md):

  import linformer_jax

  run, results = linformer_jax.train(config, WORKDIR)  # trains, then loads the run
  run = linformer_jax.load(WORKDIR)    # a trained run: config, params, tokenizer, logits
  fresh = linformer_jax.build(config)  # the same for a freshly initialised model

Importing the package stays cheap: the API's names are looked up on first
use, so importing it imports no JAX. A command (`python -m
linformer_jax.NAME`) imports the package before its own module, so its
process is set up here, before anything imports JAX (command_process.py).
"""

from linformer_jax import command_process

if command_process.is_being_started():
  command_process.prepare()

# The Python API, resolved on first use (PEP 562) from api.py.
__all__ = ['LayerAttention', 'ModelOutput', 'Run', 'TrainOutput', 'build', 'load', 'train']


def __getattr__(name: str) -> object:
  if name in __all__:
    import importlib  # pylint: disable=g-import-not-at-top

    return getattr(importlib.import_module(f'{__name__}.api'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(__all__)
