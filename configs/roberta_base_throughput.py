"""configs/roberta_base.py for 100 steps on Project Gutenberg books: a step's
tokens/s, MFU and peak device memory on one accelerator.

  python -m linformer_jax.train --config configs/roberta_base_throughput.py \
      --workdir /tmp/throughput --config.data.path=../shared/data/gutenberg \
      --config.model.attention=full --config.model.max_len=4096 --config.batch_size=8

The progress lines print tokens/s and MFU; the last lines the peak device
memory (docs/benchmarks.md, "Training throughput on an H100"). Any folder of
plain-text books will do: the figures depend on the shapes, not the text.
"""

from configs import roberta_base


def get_config():
  config = roberta_base.get_config()
  config.data.split_files = {'validation': ['pg345.txt']}  # Dracula: any folder holding it
  config.data.max_eval_batches = 2  # the final evaluation only checks the step runs
  config.batch_size = 64  # per step, on one device
  config.eval_batch_size = 64
  config.total_steps = 100  # the rates settle after about 20 steps
  config.warmup_steps = 10  # linear warm-up to learning_rate
  config.log_every = 20  # steps between progress lines (tokens/s, MFU)
  config.eval_every = 1000  # past total_steps: one evaluation, at the end
  config.checkpoint_every = 1000  # past total_steps: one checkpoint, at the end
  return config
