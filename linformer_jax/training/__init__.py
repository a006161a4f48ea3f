"""Training: tasks, the run builder, step functions, the loop and its services.

`tasks` holds one object per task (masked LM, causal LM, classification);
`text_generation` continues a prompt with a trained causal LM; `run_builder`
builds a run's mesh, model, train state and step functions in one place;
`train_steps` the jitted steps; `trainer` the loop; `checkpoints`,
`sharding`, `multihost`, `metric_writers`, `run_config` and `fine_tuning` what
the loop relies on. Imports `linformer_jax.model`, `linformer_jax.data` and
`linformer_jax.errors`, never the analysis tools or the commands.
"""
