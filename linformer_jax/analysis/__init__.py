"""Analysis: the libraries behind the benchmark, spectrum, sweep, probe and
memory commands.

Each module is importable from a notebook; the command of the same name at the
top of the package only parses flags and calls it. A benchmark's settings are
one dataclass whose fields are also the command's flags (`settings_flags`):
`benchmark_settings`, `causal_benchmark`, `data_benchmark`,
`attention_benchmark`, `pytorch_comparison` and `pooling_probe` declare them,
`flag_checks` words their errors. Imports `training`, `checkpoints`, `data`,
`model` and the base modules, never the commands.
"""
