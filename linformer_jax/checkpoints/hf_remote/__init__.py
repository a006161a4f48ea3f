"""The PyTorch model an exported Linformer folder ships as remote code.

`configuration_linformer.py` and `modeling_linformer.py` import torch and
transformers only, never JAX or this package: `checkpoints.hf_export` copies
them, as they are, into the folder it writes, where `transformers` loads them
with `trust_remote_code=True`. Nothing in the package imports them.
"""
