"""The machinery the analysis commands share, each piece once.

Each analysis command is one module at the top of the package, holding its
logic and its `main()` (`linformer_jax.benchmark`, `spectrum`, `sweep`, ...).
What more than one of them needs lives here (their settings are declared and
checked by `linformer_jax.settings_flags`): timing and random variables
(`measuring`), the paper's largest-batch method
(`benchmark_budget`), report tables (`tables`), the accelerators this host
compiles for (`xla_targets`), and the pieces a command's own module would
otherwise outgrow (its report, its settings, its corpus). Imports `training`,
`checkpoints`, `data`, `model` and the base modules, never a command.
"""
