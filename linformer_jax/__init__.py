"""Linformer (Wang et al., 2020) in JAX/Flax: linear-complexity self-attention."""
