"""Data: corpora, tokenizers and the per-task input pipelines.

`sources` holds one module per pretraining corpus (embedded, text files, TFDS),
registered by name for config.data.source, and `corpus` reads the documents of
the chosen one; `cache` says where the data cache is; `tokenizer` trains and
loads tokenizers; `units`, `prepare`, `packing` and `shards` turn a
pretraining split into packed rows in ArrayRecord shards; `pretraining` reads
them into batches with a per-sequence transform, which `masked_lm` (masking)
and `causal_lm` (next-token targets) provide; `classification` reads labelled
texts (TSV, TFDS, ListOps) and `encoding` lays them out in rows; `listops`
generates the Long Range Arena's ListOps; `loaders` is the grain loader every
pipeline shares. Imports only `linformer_jax.errors` and
`linformer_jax.registry` from the rest of the package: never the model or the
training loop.
"""
