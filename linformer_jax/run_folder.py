"""The layout of a run folder (a workdir), named in one place.

A run keeps everything in its folder, local or gs://BUCKET/PATH:

  config.json            the run's config (`run_builder.save_config`)
  extensions/            a copy of each file config.extensions names
  tokenizer.model        a SentencePiece tokenizer trained for the run
  tokenizer.json         or a Hugging Face one (an imported checkpoint's)
  import.json            what an imported checkpoint gave the run (`hf_import`)
  checkpoints/STEP/      orbax checkpoints, each with its integrity manifest
  damaged_checkpoints/   steps found damaged, moved aside
  diverged_checkpoints/  steps set aside after a divergence (from_STEP/)
  sound_steps.json       which kept steps are sound (`sound_steps`)
  metrics.jsonl          every logged scalar, a line per step
  events.out.tfevents.*  the same scalars for TensorBoard (a file per process start)
  eval_results.json      the final evaluation (`trainer`)
  profile/               a trace of config.profile_steps
  .lock                  the lease object of a gs:// run (`workdir_lock`)

Every reader and writer takes its paths from `RunFolder`, so that the layout
changes in this file alone.
"""

import dataclasses
import os

CONFIG = 'config.json'
EXTENSIONS = 'extensions'
TOKENIZER_FILES = {'sentencepiece': 'tokenizer.model', 'huggingface': 'tokenizer.json'}
IMPORT_SUMMARY = 'import.json'
CHECKPOINTS = 'checkpoints'
DAMAGED_CHECKPOINTS = 'damaged_checkpoints'
DIVERGED_CHECKPOINTS = 'diverged_checkpoints'
LEDGER = 'sound_steps.json'
METRICS = 'metrics.jsonl'
RESULTS = 'eval_results.json'
PROFILE = 'profile'
LOCK_OBJECT = '.lock'


@dataclasses.dataclass(frozen=True)
class RunFolder:
  """A run's folder: `RunFolder(workdir).checkpoints` and so on (see the
  module's docstring); `path` is the folder itself, local or gs://."""

  path: str

  def _file(self, name: str) -> str:
    return os.path.join(self.path, name)

  @property
  def config(self) -> str:
    return self._file(CONFIG)

  @property
  def extensions(self) -> str:
    return self._file(EXTENSIONS)

  def tokenizer(self, kind: str = 'sentencepiece') -> str:
    """The tokenizer file of `kind` ('sentencepiece' or 'huggingface')."""
    return self._file(TOKENIZER_FILES[kind])

  @property
  def import_summary(self) -> str:
    return self._file(IMPORT_SUMMARY)

  @property
  def checkpoints(self) -> str:
    return self._file(CHECKPOINTS)

  @property
  def damaged_checkpoints(self) -> str:
    return self._file(DAMAGED_CHECKPOINTS)

  @property
  def diverged_checkpoints(self) -> str:
    return self._file(DIVERGED_CHECKPOINTS)

  @property
  def ledger(self) -> str:
    return self._file(LEDGER)

  @property
  def metrics(self) -> str:
    return self._file(METRICS)

  @property
  def results(self) -> str:
    return self._file(RESULTS)

  @property
  def profile(self) -> str:
    return self._file(PROFILE)

  @property
  def lock_object(self) -> str:
    return self._file(LOCK_OBJECT)
