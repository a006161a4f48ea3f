"""Data: corpora, tokenizers and the per-task input pipelines.

`corpus` reads documents (embedded, text files, TFDS); `tokenizer` trains and
loads tokenizers; `packing` packs documents into sequences; `masked_lm`
masks them for pretraining, and `causal_lm` turns them into next-token
targets; `classification` reads labelled texts (TSV, TFDS, ListOps) and
`encoding` lays them out in rows; `listops` generates the Long Range Arena's
ListOps; `loaders` is the grain loader every pipeline shares. Imports only
`linformer_jax.errors` from the rest of the package: never the model or the
training loop.
"""
