"""Tokens per second of the PyTorch `linformer` package (lucidrains, 0.2.3).

The PyTorch side of `python -m linformer_jax.pytorch_comparison`, which runs
this script with the interpreter of `.venv-torch` (made by
`make torch-baseline`); it imports only torch, linformer and the standard
library, so it never touches the project's own environment. By hand:

  .venv-torch/bin/python experiments/pytorch_linformer_baseline.py \
      --seq_lens=512,1024,2048,4096,8192 --projected_len=256 --num_layers=2 \
      --hidden_dim=768 --num_heads=12 --batch=1 --repeats=5 --threads=2

Two modes, each timed `--repeats` times after one warm-up run (the median
counts):

  forward  `linformer.Linformer` (pre-LayerNorm layers, each with its own E and
           F of shape [seq_len, k] shared by the heads, MLP 4 * dim with GELU)
           on random embeddings [batch, n, dim] under torch.inference_mode();
  train    `linformer.LinformerLM` (token and position embeddings, the same
           layers, an output layer to the 1000-token vocabulary): forward,
           cross-entropy on every token, backward and a torch.optim.AdamW step.

Prints one JSON object per line per (n, mode): seq_len, projected_len, mode,
batch, time_ms (median), time_min_ms, tokens_per_s, torch_version,
linformer_version, threads and device.
"""

import argparse
import importlib.metadata
import json
import statistics
import time
import warnings

# A torch wheel without numpy warns about it on import; nothing here needs
# numpy, so the filter comes before the imports.
warnings.filterwarnings('ignore', message='Failed to initialize NumPy')
# ruff: noqa: E402
# pylint: disable=g-import-not-at-top,wrong-import-position
import linformer
import torch
import torch.nn.functional as F

# pylint: enable=g-import-not-at-top,wrong-import-position

# The vocabulary of the training step, as in the JAX benchmark.
VOCAB_SIZE = 1000
# AdamW's learning rate (the value does not change the work of a step).
LEARNING_RATE = 1e-4
MODES = ('forward', 'train')


def positive_int(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f'{text} is not a positive integer')
  return value


def positive_int_list(text: str) -> list:
  return [positive_int(part) for part in text.split(',') if part]


def mode_list(text: str) -> list:
  modes = [part for part in text.split(',') if part]
  unknown = sorted(set(modes) - set(MODES))
  if not modes or unknown:
    raise argparse.ArgumentTypeError(f'{text}: use one or more of {",".join(MODES)}')
  return modes


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--seq_lens', type=positive_int_list, default=[512, 1024, 2048, 4096, 8192])
  parser.add_argument('--projected_len', type=positive_int, default=256, help='k')
  parser.add_argument('--num_layers', type=positive_int, default=2)
  parser.add_argument('--hidden_dim', type=positive_int, default=768)
  parser.add_argument('--num_heads', type=positive_int, default=12)
  parser.add_argument('--batch', type=positive_int, default=1)
  parser.add_argument('--repeats', type=positive_int, default=5, help='timed runs per (n, mode)')
  parser.add_argument('--threads', type=positive_int, default=torch.get_num_threads())
  parser.add_argument('--modes', type=mode_list, default=list(MODES))
  parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
  args = parser.parse_args(argv)
  if args.hidden_dim % args.num_heads:
    parser.error(f'--hidden_dim={args.hidden_dim} must be divisible by --num_heads')
  return args


def wait_for(device: torch.device) -> None:
  """Returns once the device has finished the work queued so far."""
  if device.type == 'cuda':
    torch.cuda.synchronize(device)


def time_ms(call, repeats: int, device: torch.device) -> list:
  """Wall times (ms) of `repeats` calls after one warm-up call."""
  call()
  wait_for(device)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    wait_for(device)
    times.append((time.perf_counter() - start) * 1e3)
  return times


def forward_pass(args: argparse.Namespace, seq_len: int, device: torch.device):
  """A call running the encoder on random embeddings [batch, n, dim]."""
  model = linformer.Linformer(
      dim=args.hidden_dim,
      seq_len=seq_len,
      depth=args.num_layers,
      k=args.projected_len,
      heads=args.num_heads,
  )
  model = model.to(device).eval()
  embeddings = torch.randn(args.batch, seq_len, args.hidden_dim, device=device)

  def call():
    with torch.inference_mode():
      return model(embeddings)

  return call


def training_step(args: argparse.Namespace, seq_len: int, device: torch.device):
  """A call running one language-model step: forward, loss, backward, AdamW."""
  model = linformer.LinformerLM(
      num_tokens=VOCAB_SIZE,
      dim=args.hidden_dim,
      seq_len=seq_len,
      depth=args.num_layers,
      k=args.projected_len,
      heads=args.num_heads,
  )
  model = model.to(device).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
  tokens = torch.randint(0, VOCAB_SIZE, (args.batch, seq_len), device=device)

  def call():
    optimizer.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss

  return call


def main(argv=None) -> None:
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  device = torch.device(args.device)
  build = {'forward': forward_pass, 'train': training_step}
  for seq_len in args.seq_lens:
    for mode in args.modes:
      times = time_ms(build[mode](args, seq_len, device), args.repeats, device)
      median_ms = statistics.median(times)
      row = {
          'seq_len': seq_len,
          'projected_len': args.projected_len,
          'mode': mode,
          'batch': args.batch,
          'time_ms': median_ms,
          'time_min_ms': min(times),
          'tokens_per_s': args.batch * seq_len / (median_ms * 1e-3),
          'torch_version': torch.__version__,
          'linformer_version': importlib.metadata.version('linformer'),
          'threads': args.threads,
          'device': args.device,
      }
      print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
