"""The JSON items of a checkpoint: the data iterator's state and the config.

Orbax writes JSON items in a background thread, where a value that does not
serialize would only be logged and the step lost: `json_copy` converts at the
call instead, and the copy cannot change while the save is in flight. The data
state is bytes (grain's JSON-encoded iterator state) or a dict; the object that
wraps it records which.
"""

import json
from typing import Any, Dict, Union

DataState = Union[bytes, Dict[str, Any]]

# The keys of the JSON object that wraps the data state.
_UTF8_BYTES = 'utf8_bytes'
_DICT = 'dict'


def json_copy(value: Any, what: str) -> Any:
  """A JSON round-trip copy of `value`; a TypeError naming `what` if it has none."""
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise TypeError(f'The {what} of a checkpoint must be JSON-serializable: {e}') from e


def encode_data_state(data_state: DataState) -> Dict[str, Any]:
  if isinstance(data_state, bytes):
    return {_UTF8_BYTES: data_state.decode('utf-8')}
  return {_DICT: json_copy(data_state, 'data_state')}


def decode_data_state(stored: Dict[str, Any]) -> DataState:
  if _UTF8_BYTES in stored:
    return stored[_UTF8_BYTES].encode('utf-8')
  return stored[_DICT]
