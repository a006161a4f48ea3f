"""The model: attention math, Flax modules and the model's config.

`attention` holds the pure functions every kind of attention shares (softmax
attention, the paper's matrix projection); `projections` the sequence
projections, one module per `config.model.projection` value, and
`attention_kinds` the attention kinds, one module per `config.model.attention`
value (with `attention_kinds.causal_linformer`, the causal Linformer's block
summaries and decoding cache), each registered under its name; `layers` the
Flax layers that hold parameters and call them, and `models` the encoder and
its heads; `generation` samples from a causal model through its cache;
`model_config` the validated `ModelConfig`; `logical_axes` the axis names
parameters are annotated with. Imports only `linformer_jax.errors` and
`linformer_jax.registry` from the rest of the package.
"""
