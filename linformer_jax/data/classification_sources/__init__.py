"""Classification data sources, one module each, chosen by config.data.source
when config.task is 'classification'.

`base` defines what a source is (its labelled examples, its number of classes,
its checks and whether it brings its own vocabulary) and holds `REGISTRY`;
`tsv` (local TSV files), `tfds` (TFDS datasets) and `listops` (the LRA's
ListOps, generated) register themselves there when this package is imported.
A source of one's own registers the same way, in a file named in
config.extensions (docs/extending.md, "A classification dataset").
"""

# isort: off
# Imported in the order the names are listed when one is refused.
from linformer_jax.data.classification_sources import base
from linformer_jax.data.classification_sources import tsv
from linformer_jax.data.classification_sources import tfds
from linformer_jax.data.classification_sources import listops

# isort: on

REGISTRY = base.REGISTRY
checked_source = base.checked_source
source_of = base.source_of

__all__ = ['REGISTRY', 'base', 'checked_source', 'listops', 'source_of', 'tfds', 'tsv']
