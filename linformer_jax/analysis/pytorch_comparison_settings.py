"""What the PyTorch comparison measures: its settings, each one a flag of
`python -m linformer_jax.pytorch_comparison`, checked on construction."""

import dataclasses
import os
from typing import Optional, Sequence

from linformer_jax.analysis import flag_checks
from linformer_jax.analysis.benchmark_settings import VOCAB_SIZE
from linformer_jax.errors import ConfigError
from linformer_jax.model.model_config import ModelConfig
from linformer_jax.settings_flags import setting

MODES = ('forward', 'train')
# The integer settings: positive, and passed to the PyTorch script as flags of their names.
INTEGER_SETTINGS = (
    'projected_len',
    'num_layers',
    'hidden_dim',
    'num_heads',
    'batch',
    'repeats',
    'threads',
)


@dataclasses.dataclass(frozen=True)
class ComparisonSettings:
  """What to measure; invalid values raise a ConfigError naming the flag.

  Each field is also the command's flag of its name (`settings_flags`).
  """

  seq_lens: Sequence[int] = setting(
      (512, 1024, 2048, 4096, 8192), 'Sequence lengths n; only n > k run.'
  )
  projected_len: int = setting(256, "Linformer's projected length k.")
  num_layers: int = setting(2, 'Encoder layers.')
  hidden_dim: int = setting(768, 'Model width (the MLP is 4 times as wide).')
  num_heads: int = setting(12, 'Attention heads.')
  batch: int = setting(1, 'Sequences per pass or step.')
  repeats: int = setting(5, 'Timed runs per (n, mode), after a warm-up.')
  modes: Sequence[str] = setting(
      MODES, 'forward (inference pass), train (forward, backward, AdamW).'
  )
  threads: int = setting(
      help_text="PyTorch's intra-op threads; default os.cpu_count() "
      '(JAX on CPU uses one per core).',
      default_factory=lambda: os.cpu_count() or 1,
  )
  torch_python: str = setting(
      '.venv-torch/bin/python',
      'The Python that has torch and linformer==0.2.3 (`make torch-baseline` makes it).',
  )
  out: Optional[str] = setting(
      None, 'Directory for comparison.md and comparison.csv.', required=True
  )

  def __post_init__(self):
    object.__setattr__(self, 'seq_lens', tuple(self.seq_lens))
    object.__setattr__(self, 'modes', tuple(self.modes))
    flag_checks.require_lengths('seq_lens', self.seq_lens)
    flag_checks.require_model_dims(self, INTEGER_SETTINGS)
    ok = self.modes and not set(self.modes) - set(MODES) and len(set(self.modes)) == len(self.modes)
    advice = f'give one or more of {",".join(MODES)}, each once'
    flag_checks.require(ok, 'modes', self.modes, advice)
    if not self.measured_seq_lens:
      raise ConfigError(
          f'--projected_len={self.projected_len} leaves nothing to measure: it is >= every n '
          f'in --seq_lens={",".join(map(str, self.seq_lens))}; use a k below '
          f'{max(self.seq_lens)}.'
      )

  @property
  def measured_seq_lens(self) -> tuple:
    """The sequence lengths that Linformer compresses: n > k."""
    return tuple(n for n in self.seq_lens if n > self.projected_len)

  @property
  def mlp_dim(self) -> int:
    """The feed-forward width: `linformer`'s fixed 4 * dim."""
    return 4 * self.hidden_dim

  def model_config(self, seq_len: int) -> ModelConfig:
    """Our model shaped as `linformer.Linformer(dim, seq_len, depth, k, heads)`."""
    return ModelConfig(
        vocab_size=VOCAB_SIZE,
        max_len=seq_len,
        num_layers=self.num_layers,
        num_heads=self.num_heads,
        hidden_dim=self.hidden_dim,
        mlp_dim=self.mlp_dim,
        attention='linformer',
        projected_len=self.projected_len,
        sharing='headwise',
        projection='linear',
        pre_layer_norm=True,
        dropout_rate=0.0,
    )
