"""Loads exported folders with transformers and runs them (tests/test_hf_export.py).

Run by the interpreter of .venv-hf (torch and transformers, `make venv-hf`),
never by the suite's own: it imports neither JAX nor linformer_jax.

  .venv-hf/bin/python tests/hf_folder_worker.py CASES.json RESULTS.json

CASES.json lists, per case, the folder, the auto class of its task, an .npz
of the inputs (input_ids, attention_mask: a padded batch) and the texts (and
pairs) to tokenize. RESULTS.json gets, per case, the loaded model's class,
its float32 logits (an .npz beside it) and AutoTokenizer's ids.
"""

import json
import sys

import numpy as np
import torch
import transformers


def check(case):
  """What one folder gives: its class, logits and token ids."""
  folder = case['folder']
  model_class = getattr(transformers, case['auto_class'])
  model = model_class.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
  model.eval()
  inputs = np.load(case['inputs'])
  with torch.no_grad():
    logits = model(
        input_ids=torch.from_numpy(inputs['input_ids'].astype(np.int64)),
        attention_mask=torch.from_numpy(inputs['attention_mask'].astype(np.int64)),
    ).logits
  np.save(case['logits'], logits.numpy().astype(np.float32))
  result = {'class': type(model).__name__}
  if case['texts']:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # Truncated to model_max_length as the run cuts a text: its head, bos and eos kept.
    result['ids'] = [tokenizer(text, truncation=True)['input_ids'] for text in case['texts']]
    result['pairs'] = []
    for first, second in case['pairs']:
      encoded = tokenizer(first, second, truncation=True)
      result['pairs'].append([encoded['input_ids'], encoded.get('token_type_ids')])
  return result


def main(cases_file, results_file):
  cases = json.loads(open(cases_file).read())
  results = {name: check(case) for name, case in cases.items()}
  with open(results_file, 'w') as out:
    json.dump(results, out)


if __name__ == '__main__':
  main(*sys.argv[1:])
