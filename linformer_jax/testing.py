"""Checks for the author of a projection or attention kind: what every part must hold.

A kind of your own (docs/extending.md) trains without complaint even when
padding leaks into it; these checks are what its tests call to find out:

  from linformer_jax import testing

  testing.check_padding_invariance(testing.small_config(projection='convex'))
  testing.check_no_causal_leakage(
      testing.small_config(attention='tempered_linformer', projection='mean', causal=True)
  )
  testing.check_against_reference(my_float32_function, my_float64_loop, x, weight, mask)

- `check_padding_invariance(config)`: a model of the config gives the real
  tokens of an example the same logits alone and unpadded as padded to
  max_len and batched with a longer row, whatever token ids its padding holds.
- `check_no_causal_leakage(config)`: in a causal model, no real token's
  output takes a gradient from a later position (through the position
  embedding that each position's input adds).
- `check_against_reference(function, reference, *inputs)`: a function of
  float32 arrays agrees with the author's float64 reference, the same math
  written the naive way as a function of numpy arrays.

Each returns None when the part holds it, and otherwise raises an
AssertionError whose message names the kinds and what leaked or disagreed,
and by how much, so any test runner fails with that line. The models are
small (`small_config`: 2 layers, 2 heads of 4 features, n = 16, k = 4, a
vocabulary of 40), float32, with random weights of a trained model's size
rather than init's near-uniform attention: each check compiles in seconds on
a CPU.
"""

import functools
from typing import Any, Callable, Dict, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linformer_jax.model import models
from linformer_jax.model.model_config import ModelConfig

# The sizes of `small_config`; block_len serves a causal Linformer (two blocks).
# No dropout (the checks run in inference mode anyway): a kind that forms no
# attention weights refuses a rate above 0.
SMALL_MODEL = dict(
    vocab_size=40,
    max_len=16,
    num_layers=2,
    num_heads=2,
    hidden_dim=8,
    mlp_dim=16,
    projected_len=4,
    block_len=8,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def small_config(**fields: Any) -> ModelConfig:
  """A `ModelConfig` of a small model (`SMALL_MODEL`), `fields` overriding
  its values, e.g. projection='convex', attention='tempered_linformer',
  causal=True, extension_settings={'temperature_init': 2.0}. The kinds must
  be registered first (`extensions.import_extensions`)."""
  return ModelConfig(**{**SMALL_MODEL, **fields})


def _parts(config: ModelConfig) -> str:
  """'attention=..., projection=...' of a config, for messages."""
  words = f'attention={config.attention!r}'
  if config.attention_kind.uses_projection:
    words += f', projection={config.projection!r}'
  return words + (', causal' if config.causal else '')


def _model(config: ModelConfig) -> nn.Module:
  return (models.CausalLanguageModel if config.causal else models.MaskedLanguageModel)(config)


def random_variables(config: ModelConfig, seed: int = 0) -> Dict[str, Any]:
  """Variables of the checks' model of `config` (a causal LM when causal, a
  masked LM otherwise): every parameter drawn from N(0, 0.5^2), so that
  attention is far from uniform; fixed arrays ('constants') as initialised."""
  init = functools.partial(
      _model(config).init, jax.random.PRNGKey(seed), jnp.ones((1, config.max_len), jnp.int32)
  )
  shapes = nn.meta.unbox(jax.eval_shape(init))
  # Initialised (compiled) only for the fixed arrays, when the kinds hold some.
  variables = nn.meta.unbox(jax.jit(init)()) if set(shapes) != {'params'} else shapes
  leaves, tree = jax.tree_util.tree_flatten(shapes['params'])
  rng = np.random.default_rng(seed)
  drawn = [jnp.asarray(0.5 * rng.standard_normal(leaf.shape), leaf.dtype) for leaf in leaves]
  return {**variables, 'params': jax.tree_util.tree_unflatten(tree, drawn)}


def _largest_difference(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float):
  """(how many values differ beyond the tolerance, the largest difference,
  its index); non-finite values differ."""
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  close = np.isclose(actual, expected, rtol=rtol, atol=atol)
  finite = np.isfinite(actual) & np.isfinite(expected)
  difference = np.where(close, 0.0, np.where(finite, np.abs(actual - expected), np.inf))
  if not difference.size:
    return 0, 0.0, ()
  index = np.unravel_index(np.argmax(difference), difference.shape)
  return int((~close).sum()), float(difference[index]), index


def check_padding_invariance(
    config: ModelConfig,
    *,
    appended_padding: bool = True,
    variables: Optional[Dict[str, Any]] = None,
    seed: int = 0,
    tolerance: float = 1e-5,
) -> None:
  """Checks that padding never reaches a real token's output.

  A model of `config` (a masked LM, or a causal LM when config.causal) reads
  an example of max_len // 2 - 1 real tokens alone and unpadded, then padded
  to max_len and batched with a row of max_len real tokens, the padding
  holding some token ids and then others. The real tokens' logits must agree
  (rtol and atol `tolerance`) each time.

  Args:
    config: the model, e.g. `small_config(projection='convex')`.
    appended_padding: False for a kind that documents that the amount of
      padding may change real outputs (the Reformer's chunks follow the
      padded length): only the padding's content is changed then.
    variables: the model's variables; by default `random_variables(config, seed)`.
    seed: of the variables and the token ids.
    tolerance: relative and absolute.

  Raises:
    AssertionError: the logits of real tokens changed (or are not finite),
      naming the kinds, the change of padding and the largest difference.
  """
  model = _model(config)
  variables = random_variables(config, seed) if variables is None else variables
  apply = jax.jit(model.apply)
  length = config.max_len
  real_len = max(1, length // 2 - 1)
  rng = np.random.default_rng(seed)
  tokens, padding = rng.integers(0, config.vocab_size, (2, 2, length))
  mask = np.arange(length)[None] < np.array([[real_len], [length]])

  def fail_unless_same(changed, reference, what):
    count, largest, index = _largest_difference(changed, reference, tolerance, tolerance)
    if count:
      raise AssertionError(
          f'padding leaks into real tokens ({_parts(config)}): {what} changes {count} of '
          f'their logits, by up to {largest:.3g} (at real token {index[0]}; tolerance '
          f'{tolerance:g}).'
      )

  alone = np.asarray(apply(variables, jnp.asarray(tokens[:1, :real_len])))[0]
  if not np.all(np.isfinite(alone)):
    raise AssertionError(
        f'{_parts(config)}: an example of {real_len} tokens alone, unpadded, gives non-finite '
        'logits; give variables= that the kinds can use.'
    )
  # Both fillings of the padding in one batch: [example, full row] twice.
  shift = 1 + rng.integers(0, config.vocab_size - 1, padding.shape)
  other_ids = (padding + shift) % config.vocab_size
  rows = np.concatenate([np.where(mask, tokens, padding), np.where(mask, tokens, other_ids)])
  out = np.asarray(apply(variables, jnp.asarray(rows), jnp.asarray(np.concatenate([mask, mask]))))
  if appended_padding:
    fail_unless_same(
        out[0, :real_len],
        alone,
        f'padding {real_len} real tokens to {length} (batched with a row of {length})',
    )
  fail_unless_same(
      out[2, :real_len],
      out[0, :real_len],
      f'changing the token ids of the {length - real_len} padded positions',
  )


def check_no_causal_leakage(
    config: ModelConfig,
    *,
    variables: Optional[Dict[str, Any]] = None,
    seed: int = 0,
    tolerance: float = 0.0,
) -> None:
  """Checks that no output of a causal model depends on a later position.

  The gradient of every real token's logits (a random mix of them, per
  position) is taken with respect to the position embedding, whose row s
  enters the model at position s alone; the rows after each position must
  get none of it. The batch holds a full row and a padded one.

  Args:
    config: a causal model (causal=True), e.g. `small_config(projection='mean',
      causal=True)`.
    variables: the model's variables; by default `random_variables(config, seed)`.
    seed: of the variables, the token ids and the mix of logits.
    tolerance: the largest gradient from a later position allowed (none).

  Raises:
    ValueError: config is not causal.
    AssertionError: an output takes a gradient from a later position,
      naming the kinds, the first such pair of positions and its size.
  """
  if not config.causal:
    raise ValueError(f'check_no_causal_leakage checks a causal model; {_parts(config)} is not.')
  model = _model(config)
  variables = random_variables(config, seed) if variables is None else variables
  length = config.max_len
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, length)))
  mask = np.arange(length)[None] < np.array([[length], [length // 2 + 1]])
  mix = rng.normal(size=(2, length, config.vocab_size)) * mask[:, :, None]
  mix = jnp.asarray(mix, jnp.float32)

  def logits_by_position(position_embedding):
    params = {**variables['params']}
    params['encoder'] = {**params['encoder'], 'position_embedding': position_embedding}
    logits = model.apply({**variables, 'params': params}, tokens, jnp.asarray(mask))
    return jnp.sum(logits * mix, axis=(0, 2))  # [length]: position t's mixed logits

  embedding = variables['params']['encoder']['position_embedding']
  jacobian = np.asarray(jax.jit(jax.jacrev(logits_by_position))(embedding))
  received = np.abs(jacobian).max(axis=-1)[:, :length]  # [t, s]
  leaks = np.where(np.triu(np.ones((length, length), bool), k=1), received, 0.0)
  if not np.all(leaks <= tolerance):
    t, s = (int(i) for i in np.argwhere(~(leaks <= tolerance))[0])
    count = int((~(leaks <= tolerance)).sum())
    raise AssertionError(
        f'causal leakage ({_parts(config)}): the output at position {t} takes a gradient of '
        f'{leaks[t, s]:.3g} from position {s}, a later one ({count} such pairs of positions); '
        'a causal pass must see positions <= t only.'
    )


def _inputs_as(inputs, float_dtype, to_array):
  """Floating inputs in `float_dtype`, others (masks, ids) as they are."""
  converted = []
  for value in inputs:
    array = np.asarray(value)
    if np.issubdtype(array.dtype, np.floating):
      array = array.astype(float_dtype)
    converted.append(to_array(array))
  return converted


def check_against_reference(
    function: Callable[..., Any],
    reference: Callable[..., Any],
    *inputs: Any,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    name: Optional[str] = None,
) -> None:
  """Checks a function of float32 arrays against a float64 reference.

  `function` gets the inputs as JAX arrays, the floating ones float32;
  `reference` gets them as numpy arrays, the floating ones float64. Both
  return an array, or a tuple of arrays (e.g. `compress`'s slots and mask),
  compared element by element; an output that both give as None is skipped.

  Args:
    function: the part's math, e.g. lambda x, e, mask: kind.compress(x, e,
      max_len=16, projected_len=4, key_padding_mask=mask).
    reference: the same written the naive way, in numpy float64.
    *inputs: the arrays, e.g. x, a weight and a padding mask.
    rtol, atol: the tolerance of `numpy.isclose`.
    name: what the message calls `function` (by default its __name__).

  Raises:
    AssertionError: an output disagrees (or has another shape, or is
      missing), naming it, how many values differ, the largest difference
      and where.
  """
  name = name or getattr(function, '__name__', 'the function')
  actual = function(*_inputs_as(inputs, np.float32, jnp.asarray))
  expected = reference(*_inputs_as(inputs, np.float64, lambda array: array))
  several = isinstance(actual, (tuple, list))
  if several != isinstance(expected, (tuple, list)) or (several and len(actual) != len(expected)):
    raise AssertionError(f'{name} and the reference return different numbers of outputs.')
  for number, (got, wanted) in enumerate(
      zip(actual, expected) if several else [(actual, expected)]
  ):
    output = f'output {number} of {name}' if several else name
    if got is None or wanted is None:
      if got is not wanted:
        missing = 'the reference' if wanted is None else name
        raise AssertionError(f'{output}: {missing} gives None where the other gives an array.')
      continue
    got, wanted = np.asarray(got), np.asarray(wanted)
    if got.shape != wanted.shape:
      raise AssertionError(f'{output} has shape {got.shape}, the float64 reference {wanted.shape}.')
    count, largest, index = _largest_difference(got, wanted, rtol, atol)
    if count:
      raise AssertionError(
          f'{output} disagrees with the float64 reference: {count} of {got.size} values '
          f'differ, the largest by {largest:.3g} at index {tuple(int(i) for i in index)} '
          f'({float(got[index]):.6g} vs {float(wanted[index]):.6g}; rtol {rtol:g}, atol {atol:g}).'
      )
