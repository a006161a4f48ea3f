"""Checkpoints: the run's orbax store, its step folders, Hugging Face weights.

`store` writes and reads a run's checkpoints, with `orbax_items` (each item's
orbax handlers, the stored arrays checked against the wanted ones);
`partial_restore` reads parts of another run's checkpoint (these three are the
only modules that import orbax); `step_files` seals every step folder with an
integrity manifest and moves damaged steps aside; `full_disk` stops a save
before it fills the disk; `hf_checkpoint` reads a Hugging Face RoBERTa or BERT
folder, `hf_tensors` maps its tensors onto this project's parameters, and
`hf_conversion` puts them and the checkpoint's model fields into a run's
parameters and config. Imports `linformer_jax.model`, `linformer_jax.data` and
the base modules, never training, the analysis tools or the commands: training
builds on it.
"""
