"""Where a train step's time goes on an accelerator: the step of
configs/roberta_base_throughput.py, timed and traced on synthetic batches.

  python -m experiments.gpu_step_profile --attention=linformer --max_len=512 --batch=64
  JAX_DEFAULT_PRNG_IMPL=rbg python -m experiments.gpu_step_profile --dropout=0.0
  python -m experiments.gpu_step_profile --attention_dropout=0.0 --activation_dropout=0.1

The last is the dropout of before RoBERTa's three rates (on the MLP's hidden,
none on the attention weights); the defaults are RoBERTa's (0.1, 0.1, 0.0).

It builds the run's own train step (`run_builder`, the trainer's path) and
feeds it one masked-LM batch: random tokens, 15% of each row masked with the
mask token, no padding. No data is read, so the step time holds no input
pipeline. It prints 'RESULT {json}' (step time: the median of 3 windows of 10
steps after 5 warm-up steps; tokens/s; peak device memory), then a
`jax.profiler` trace of 3 steps summed by kernel (ms per step): the device's
busy time per stream and the kernels that take most of it. docs/benchmarks.md,
"Where the step's time goes", has its figures on an H100.
"""

import collections
import glob
import json
import shutil
import tempfile
import time

from absl import app
from absl import flags
import jax
from jax.profiler import ProfileData
import numpy as np

from configs import roberta_base_throughput
from linformer_jax.training import compiled_step
from linformer_jax.training import optimization
from linformer_jax.training import run_builder

_ATTENTION = flags.DEFINE_enum('attention', 'linformer', ['linformer', 'full'], 'The model.')
_MAX_LEN = flags.DEFINE_integer('max_len', 512, 'n, tokens per sequence.')
_BATCH = flags.DEFINE_integer('batch', 64, 'Sequences per step.')
_DROPOUT = flags.DEFINE_float('dropout', 0.1, 'model.dropout_rate.')
_ATTENTION_DROPOUT = flags.DEFINE_float(
    'attention_dropout', 0.1, 'model.attention_dropout_rate (> 0: the einsums, no fused kernel).'
)
_ACTIVATION_DROPOUT = flags.DEFINE_float(
    'activation_dropout', 0.0, "model.activation_dropout_rate, on the MLP's hidden."
)
_KERNEL = flags.DEFINE_string('attention_kernel', 'auto', 'model.attention_kernel.')
_SMALL = flags.DEFINE_bool('small', False, 'A 2-layer float32 model: checks the script on a CPU.')
_TOP = flags.DEFINE_integer('top', 25, 'Kernels listed.')
TRACED_STEPS = 3


def synthetic_batch(batch: int, length: int, vocab_size: int, mask_token: int = 4) -> dict:
  """A masked-LM batch: random targets, 15% of each row's positions masked."""
  rng = np.random.default_rng(0)
  targets = rng.integers(mask_token + 1, vocab_size, size=(batch, length)).astype(np.int32)
  weights = np.zeros((batch, length), np.float32)
  for row in weights:
    row[rng.choice(length, size=int(0.15 * length), replace=False)] = 1.0
  return {
      'inputs': np.where(weights > 0, mask_token, targets).astype(np.int32),
      'targets': targets,
      'weights': weights,
      'padding_mask': np.ones((batch, length), bool),
  }


def kernel_times(trace_dir: str, device_prefix: str) -> tuple:
  """(ms per step by stream, ms per step by kernel) of the devices' planes."""
  path = sorted(glob.glob(f'{trace_dir}/**/*.xplane.pb', recursive=True))[-1]
  by_stream, by_kernel = collections.Counter(), collections.Counter()
  for plane in ProfileData.from_file(path).planes:
    if not plane.name.startswith(device_prefix):
      continue
    for line in plane.lines:
      for event in line.events:
        ms = event.duration_ns / 1e6 / TRACED_STEPS
        by_stream[f'{plane.name} {line.name}'] += ms
        if not line.name.startswith('XLA'):  # kernels, not the ops that launch them
          by_kernel[event.name[:100]] += ms
  return by_stream, by_kernel


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}; every setting is a --flag.')
  config = roberta_base_throughput.get_config()
  config.model.attention = _ATTENTION.value
  config.model.max_len = length = _MAX_LEN.value
  config.batch_size = _BATCH.value
  config.model.dropout_rate = _DROPOUT.value
  config.model.attention_dropout_rate = _ATTENTION_DROPOUT.value
  config.model.activation_dropout_rate = _ACTIVATION_DROPOUT.value
  config.model.attention_kernel = _KERNEL.value
  if _SMALL.value:
    config.model.update(num_layers=2, hidden_dim=64, mlp_dim=128, num_heads=2, dtype='float32')
  parts = run_builder.build_parts(config)
  optimizer = optimization.create_optimizer(parts.settings.optimizer)
  abstract_state = parts.abstract_train_state(optimizer)
  state = parts.initial_train_state(optimizer, abstract_state, seed=0)
  batch = parts.device_batch(synthetic_batch(_BATCH.value, length, config.data.vocab_size))
  key = jax.random.fold_in(jax.random.PRNGKey(0), 1)
  start = time.perf_counter()
  step = parts.jit_train_step(optimizer, abstract_state).lower(state, batch, key).compile()
  compile_s = time.perf_counter() - start
  for _ in range(5):
    state, metrics = step(state, batch, key)
  jax.block_until_ready(state)
  windows = []
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(10):
      state, metrics = step(state, batch, key)
    jax.block_until_ready(state)
    windows.append((time.perf_counter() - start) / 10)
  trace_dir = tempfile.mkdtemp(prefix='step_profile_')
  with jax.profiler.trace(trace_dir):
    for _ in range(TRACED_STEPS):
      state, metrics = step(state, batch, key)
    jax.block_until_ready(state)
  step_s = float(np.median(windows))
  peak = compiled_step.peak_device_bytes()
  result = {
      'attention': _ATTENTION.value,
      'kernel': parts.model_config.attention_kernel,
      'prng': str(jax.config.jax_default_prng_impl),
      'n': length,
      'batch': _BATCH.value,
      'dropout': _DROPOUT.value,
      'attention_dropout': _ATTENTION_DROPOUT.value,
      'activation_dropout': _ACTIVATION_DROPOUT.value,
      'compile_s': round(compile_s, 1),
      'step_ms': round(step_s * 1e3, 2),
      'window_ms': [round(w * 1e3, 2) for w in windows],
      'tokens_per_s': round(_BATCH.value * length / step_s),
      'peak_gib': round(peak / 2**30, 2) if peak else None,
      'loss': round(float(metrics['loss']), 4),
  }
  print('RESULT', json.dumps(result), flush=True)
  device = '/host:CPU' if jax.default_backend() == 'cpu' else '/device:'
  by_stream, by_kernel = kernel_times(trace_dir, device)
  shutil.rmtree(trace_dir, ignore_errors=True)
  print(f'busy, ms per step ({TRACED_STEPS} traced steps):')
  for stream, ms in by_stream.most_common(8):
    print(f'  {ms:9.2f}  {stream}')
  print('kernels, ms per step:')
  for kernel, ms in by_kernel.most_common(_TOP.value):
    print(f'  {ms:9.2f}  {kernel}')


if __name__ == '__main__':
  app.run(main)
