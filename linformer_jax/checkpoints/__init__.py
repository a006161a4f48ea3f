"""Checkpoints: the run's orbax store, its step folders, Hugging Face weights.

`store` writes and reads a run's checkpoints (the only module that imports
orbax); `step_files` seals every step folder with an integrity manifest, moves
damaged steps aside and stops a save before it fills the disk;
`hf_checkpoint` reads a Hugging Face RoBERTa or BERT folder and maps its
tensors onto this project's parameters, and `hf_conversion` puts them and the
checkpoint's model fields into a run's parameters and config. Imports
`linformer_jax.model`, `linformer_jax.data` and the base modules, never
training, the analysis tools or the commands: training builds on it.
"""
