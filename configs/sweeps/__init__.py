"""Sweep files: a base config and named variants, run by linformer_jax.sweep.

  python -m linformer_jax.sweep --sweep configs/sweeps/projected_len.py \
      --workdir runs/sweeps/projected_len
"""
