"""The model: attention math, Flax modules and the model's config.

`attention` holds the pure functions (full and compressed attention, the
sequence projections) and `causal_attention` the causal Linformer's (block
summaries, decoding cache); `layers` the Flax layers that hold parameters and
call them, and `models` the encoder and its heads; `generation` samples from a
causal model through its cache; `model_config` the validated `ModelConfig`;
`logical_axes` the axis names parameters are annotated with. Imports only
`linformer_jax.errors` from the rest of the package.
"""
