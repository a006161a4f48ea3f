"""ListOps at CPU scale: trees of at most 512 tokens and a 2-layer model.

  python -m linformer_jax.train --config configs/lra_listops_cpu.py \
      --workdir runs/listops_cpu_linformer
  python -m linformer_jax.train --config configs/lra_listops_cpu.py \
      --workdir runs/listops_cpu_transformer --config.model.attention=full

configs/lra_listops.py is the Long Range Arena's setting (trees of 500-2,000
tokens, 6 layers x 512), far beyond a 2-core CPU. This one keeps the LRA's
generator (operators, depth, arguments, 96,000 / 2,000 / 2,000 unique trees)
but keeps trees of 100-512 tokens, pads them to n = 512, and trains a
2-layer, 128-wide model with a higher learning rate. Linformer uses k = 128
(n/k = 4) with one E, F per layer. Both models are compared in
configs/sweeps/listops_cpu.py; the results are in docs/results_parity.md.
"""

from configs import lra_listops


def get_config():
  config = lra_listops.get_config()
  config.data.listops.min_length = 100  # shortest kept tree, in tokens
  config.data.listops.max_length = 512  # longest kept tree (and the padded length)
  config.total_steps = 2000  # optimizer steps of batch 32 (0.67 epoch)
  config.warmup_steps = 200  # linear warm-up, then cosine decay
  config.learning_rate = 1e-3  # peak learning rate
  config.eval_every = 250  # validation accuracy every 250 steps: the curves
  config.checkpoint_every = 500
  model = config.model
  model.max_len = 512  # n
  model.projected_len = 128  # k
  model.num_layers = 2
  model.num_heads = 4
  model.hidden_dim = 128
  model.mlp_dim = 256
  return config
