"""Analysis: the libraries behind the benchmark, spectrum, sweep and mesh-memory
commands.

Each module is importable from a notebook; the command of the same name at the
top of the package only parses flags and calls it. Imports `training`,
`checkpoints`, `data`, `model` and `linformer_jax.errors`, never the commands.
"""
