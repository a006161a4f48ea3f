"""The settings of `python -m linformer_jax.benchmark`, whose flags they are."""

import dataclasses
import os
from typing import Any, Optional, Sequence

import jax

from linformer_jax import settings_flags
from linformer_jax.analysis import benchmark_report
from linformer_jax.analysis.benchmark_report import EFFICIENT_TRANSFORMER
from linformer_jax.analysis.benchmark_report import LINFORMER
from linformer_jax.analysis.benchmark_report import TRANSFORMER
from linformer_jax.errors import ConfigError
from linformer_jax.model.attention import ATTENTION_KERNELS
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting
from linformer_jax.units import GIB

# Small enough that the embedding and its lookup do not dominate the encoder.
VOCAB_SIZE = 1000
DTYPES = ('float32', 'bfloat16')
# Share of the device's (or host's) memory a cell may plan to use by default.
DEFAULT_MEMORY_FRACTION = 0.8
# A budget run's peak resident memory over its budget (docs/benchmarks.md,
# "XLA:CPU's library fusions": 12.0 GiB at 8 GiB).
BUDGET_RUNTIME_FACTOR = 1.5
# The attention kernels that run on one backend only: its name and the device.
_KERNEL_DEVICES = {'cudnn': ('gpu', 'an NVIDIA GPU'), 'pallas': ('tpu', 'a TPU')}


def benchmark_model(settings: Any, **fields: Any) -> ModelConfig:
  """A benchmark's model: a vocabulary of VOCAB_SIZE, no dropout, the settings'
  num_layers, num_heads, hidden_dim and mlp_dim, and the other `fields` given."""
  sizes = ('num_layers', 'num_heads', 'hidden_dim', 'mlp_dim')
  dims = {name: getattr(settings, name) for name in sizes}
  return ModelConfig(
      vocab_size=VOCAB_SIZE, dropout_rate=0.0, attention_dropout_rate=0.0, **dims, **fields
  )


def model_size_settings(
    num_layers: int, hidden_dim: int, num_heads: int, mlp_dim: int, source: str = ''
) -> type:
  """A frozen dataclass of the encoder's size settings, each the flag of its
  name, with these defaults (`source` names where they come from, for the
  help): the base of a benchmark's settings class."""
  where = f' ({source}: {{}})' if source else ''
  sizes = (
      ('num_layers', num_layers, 'Encoder layers.'),
      ('hidden_dim', hidden_dim, 'Model width.'),
      ('num_heads', num_heads, 'Attention heads.'),
      ('mlp_dim', mlp_dim, 'Feed-forward hidden width.'),
  )
  fields = [
      (name, int, setting(default, help_text[:-1] + where.format(default) + '.', minimum=1))
      for name, default, help_text in sizes
  ]
  return dataclasses.make_dataclass('ModelSizeSettings', fields, frozen=True)


def require_heads_divide_width(settings: Any) -> None:
  """--num_heads must divide --hidden_dim."""
  advice = f'it must be divisible by --num_heads={settings.num_heads}'
  ok = settings.hidden_dim % settings.num_heads == 0
  settings_flags.require(ok, 'hidden_dim', settings.hidden_dim, advice)


def memory_limit_of_flag(limit_gb: Optional[float]) -> float:
  """--memory_limit_gb in bytes; unset, `default_memory_limit_bytes()`."""
  return default_memory_limit_bytes() if limit_gb is None else limit_gb * GIB


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings(model_size_settings(12, 768, 12, 3072)):
  """What to measure: each field is the flag of its name, or of `flag` (in GiB for bytes).

  Invalid values raise a ConfigError naming the flag.
  """

  seq_lens: Sequence[int] = setting(
      tuple(2**p for p in range(9, 17)), 'Sequence lengths n.', minimum=1
  )
  projected_lens: Sequence[int] = setting(
      (128, 256, 512, 1024, 2048),
      "Linformer's projected lengths k; only k < n are measured.",
      minimum=1,
  )
  batch: int = setting(1, 'Sequences per forward pass; ignored with --memory_budget_gb.', minimum=1)
  repeats: int = setting(10, 'Timed runs per cell.', minimum=1)
  dtype: str = setting('float32', 'Compute dtype.', choices=DTYPES)
  train_throughput: bool = setting(False, 'Also time an MLM training step per cell.')
  matmul_sizes: Sequence[int] = setting(
      (1024, 2048, 4096),
      'Sides of the square jnp.dots timed for the matmul rate (the best counts).',
      minimum=1,
  )
  memory_limit_bytes: float = setting(
      float('inf'),
      'At a fixed --batch, skip cells planning more temporary + argument '
      'GiB; default 80% of the device memory JAX may use (of the host RAM on '
      'CPU). With --memory_budget_gb it only guards --train_throughput.',
      flag='memory_limit_gb',
      flag_default=None,
      from_flag=memory_limit_of_flag,
  )
  inference_chunk: int = setting(
      0,
      'Positions per chunk of the queries and MLP of Linformer and of an added '
      "memory-efficient Transformer ('transformer-efficient'); 0 runs one pass.",
      minimum=0,
  )
  attention_kernel: str = setting(
      'einsum',
      'Attention of the memory-efficient Transformer, added at every n unless '
      'einsum with --inference_chunk=0: einsum, or jax.nn.dot_product_attention '
      'with its xla or cudnn (NVIDIA GPU, bfloat16) implementation.',
      choices=ATTENTION_KERNELS,
  )
  memory_budget_bytes: Optional[float] = setting(
      None,
      "The paper's method: run every cell at the largest batch whose compiled "
      'temporary + argument + output bytes fit this many GiB, instead of --batch; '
      'at most --memory_limit_gb / 1.5 (a budget run peaks at about 1.5 times it).',
      flag='memory_budget_gb',
      from_flag=lambda budget_gb: None if budget_gb is None else budget_gb * GIB,
  )
  max_batch: int = setting(
      4096, 'The largest batch the --memory_budget_gb search tries.', minimum=1
  )
  out: Optional[str] = setting(
      None, 'Directory for results.csv, table.md and the plots.', required=True
  )

  def __post_init__(self):
    settings_flags.check(self)
    require_heads_divide_width(self)
    if min(self.projected_lens) >= max(self.seq_lens):
      raise ConfigError(
          f'--projected_lens={",".join(map(str, self.projected_lens))} leaves no Linformer cell: '
          f'every k is >= every n in --seq_lens; use some k < {max(self.seq_lens)}.'
      )
    if not self.memory_limit_bytes > 0:
      raise ConfigError('--memory_limit_gb must be positive.')
    self._validate_efficient_transformer()
    budget = self.memory_budget_bytes
    if budget is None:
      return
    advice = 'give a positive number of GiB, e.g. 16, or leave it unset to time a fixed --batch'
    settings_flags.require(budget > 0, 'memory_budget_gb', f'{budget / GIB:g}', advice)
    if budget * BUDGET_RUNTIME_FACTOR > self.memory_limit_bytes:
      limit = self.memory_limit_bytes / GIB
      raise ConfigError(
          f'--memory_budget_gb={budget / GIB:g} does not fit this machine: running a '
          f'batch that fills it takes up to {BUDGET_RUNTIME_FACTOR:g}x the budget '
          f'({budget * BUDGET_RUNTIME_FACTOR / GIB:.1f} GiB), more than the memory limit of '
          f'{limit:.1f} GiB; use --memory_budget_gb={limit / BUDGET_RUNTIME_FACTOR:.1f} or '
          'less, or raise --memory_limit_gb.'
      )

  def _validate_efficient_transformer(self) -> None:
    kernel = self.attention_kernel
    if kernel == 'cudnn' and self.dtype != 'bfloat16':
      raise ConfigError(
          '--attention_kernel=cudnn needs --dtype=bfloat16 (cuDNN attention takes '
          '16-bit inputs); or use --attention_kernel=xla.'
      )
    backend, device = _KERNEL_DEVICES.get(kernel, (None, None))
    if backend and backend != jax.default_backend():
      raise ConfigError(
          f'--attention_kernel={kernel} needs {device}, not {jax.default_backend()}; '
          'use --attention_kernel=xla.'
      )

  @property
  def has_efficient_transformer(self) -> bool:
    """Whether the grid adds the memory-efficient Transformer at every n."""
    return self.inference_chunk > 0 or self.attention_kernel != 'einsum'

  def model_config(
      self, model: str, seq_len: int, projected_len: Optional[int] = None
  ) -> ModelConfig:
    """The encoder of one cell of `model`; k is unused (and set to n) but for Linformer."""
    if model not in benchmark_report.MODELS:
      raise ValueError(f'Unknown benchmark model {model!r}; use one of {benchmark_report.MODELS}.')
    return benchmark_model(
        self,
        max_len=seq_len,
        attention='linformer' if model == LINFORMER else 'full',
        projected_len=projected_len if model == LINFORMER else seq_len,
        sharing='layerwise',
        projection='linear',
        dtype=self.dtype,
        inference_chunk=0 if model == TRANSFORMER else self.inference_chunk,
        attention_kernel=self.attention_kernel if model == EFFICIENT_TRANSFORMER else 'einsum',
    )


def default_memory_limit_bytes() -> float:
  """80% of what JAX may allocate on the first device, else of the host's RAM."""
  try:
    stats = jax.devices()[0].memory_stats()
  except (NotImplementedError, RuntimeError):
    stats = None
  if stats and stats.get('bytes_limit'):
    total = stats['bytes_limit']
  else:
    total = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  return DEFAULT_MEMORY_FRACTION * total
