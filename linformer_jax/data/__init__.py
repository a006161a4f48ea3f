"""Data: corpora, tokenizers and the per-task input pipelines.

`corpus` reads documents (embedded, text files, TFDS); `tokenizer` trains and
loads tokenizers; `masked_lm` packs and masks pretraining sequences;
`classification` reads labelled texts (TSV, TFDS, ListOps); `listops`
generates the Long Range Arena's ListOps; `loaders` is the grain loader both
pipelines share. Imports only `linformer_jax.errors` from the rest of the
package: never the model or the training loop.
"""
