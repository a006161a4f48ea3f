"""Training: tasks, the run builder, step functions, the loop and its services.

`tasks` holds one object per task (masked LM, causal LM, classification);
`text_generation` continues a prompt with a trained causal LM; `run_builder`
builds a run's mesh, model, train state and step functions in one place, and
`run_loading` loads a run's checkpoint without training it; `train_steps` the
jitted steps, `optimization` the optimizer; `training_run` a run's state and
checkpoints, `trainer` the loop; `sharding`, `multihost`, `metric_writers`,
`run_config` and `fine_tuning` what the loop relies on; `hf_import` writes a
Hugging Face checkpoint as a run. Imports `linformer_jax.checkpoints`,
`linformer_jax.model`, `linformer_jax.data` and the base modules, never the
analysis tools or the commands.
"""
