"""Pretraining data sources, one module each, chosen by config.data.source.

`base` defines what a source is (its documents, its units and its signature)
and holds `REGISTRY`; `embedded` (Python's own documentation, the default),
`text_files` (local text files, e.g. Project Gutenberg books) and `tfds` (TFDS
text datasets) register themselves there when this package is imported. A
source of one's own registers the same way, in a file named in
config.extensions (docs/examples/jsonl_source.py).
"""

from linformer_jax.data.sources import base
from linformer_jax.data.sources import embedded
from linformer_jax.data.sources import text_files
from linformer_jax.data.sources import tfds

REGISTRY = base.REGISTRY
source_of = base.source_of

__all__ = ['REGISTRY', 'base', 'embedded', 'source_of', 'text_files', 'tfds']
