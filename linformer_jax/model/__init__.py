"""The model: attention math, Flax modules and the model's config.

`attention` holds the pure functions (full and compressed attention, the
sequence projections); `models` the Flax modules that hold parameters and call
them; `model_config` the validated `ModelConfig`; `logical_axes` the axis names
parameters are annotated with. Imports only `linformer_jax.errors` from the
rest of the package.
"""
