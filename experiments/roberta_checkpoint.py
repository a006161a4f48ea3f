"""A small RoBERTa checkpoint made as public ones are, for the uptraining measurement.

Trains a byte-level BPE tokenizer and a `RobertaForMaskedLM` with the Hugging
Face libraries on the training books of the Gutenberg corpus, and saves the
folder `save_pretrained` writes (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json): the input of
`python -m linformer_jax.import_checkpoint` when no public checkpoint can be
downloaded. Needs torch and transformers, which the project never imports:

  make torch-baseline  # once: torch, transformers (and linformer) in .venv-torch
  .venv-torch/bin/python experiments/roberta_checkpoint.py \
      --data ../shared/data/gutenberg --out runs/roberta_gutenberg --steps 1500

The architecture is configs/gutenberg.py's model as RoBERTa builds it: 3
post-LN layers, 128 wide, 4 heads, MLP 512, exact GELU, 8,000 tokens, n = 256
(258 positions: RoBERTa's first real token is at pad_token_id + 1). Training is
RoBERTa's recipe at this scale: 15% of tokens chosen (80% <mask>, 10% random,
10% kept) by `DataCollatorForLanguageModeling`, AdamW (betas 0.9/0.98, weight
decay 0.01), linear warm-up over 6% of the steps then linear decay, dropout 0.1,
batch 32 of 256-token rows cut from the books. It prints the masked-LM loss
every 100 steps and, at the end, on the validation books. The validation and
test books of ../shared/data/README.md are never trained on.
"""

import argparse
import json
import pathlib
import re
import time

import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import processors
from tokenizers import trainers
import torch
import transformers

HELD_OUT = ('pg345.txt', 'pg174.txt', 'pg42.txt', 'pg768.txt', 'pg8374.txt', 'pg2496.txt')
VALIDATION = ('pg345.txt', 'pg174.txt', 'pg42.txt')
SPECIAL = ['<s>', '<pad>', '</s>', '<unk>']  # ids 0-3, as RoBERTa's; <mask> is the last id


def book_text(path: pathlib.Path) -> str:
  """A book without the Project Gutenberg header and licence."""
  text = path.read_text(encoding='utf-8', errors='replace')
  start = re.search(r'\*\*\* ?START OF.*?\*\*\*', text)
  end = re.search(r'\*\*\* ?END OF', text)
  return text[start.end() if start else 0 : end.start() if end else len(text)]


def paragraphs(books):
  for book in books:
    for paragraph in re.split(r'\n\s*\n', book_text(book)):
      paragraph = ' '.join(paragraph.split())
      if paragraph:
        yield paragraph


def train_tokenizer(books, vocab_size: int) -> tokenizers.Tokenizer:
  tokenizer = tokenizers.Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size - 1,
      special_tokens=SPECIAL,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tokenizer.train_from_iterator(paragraphs(books), trainer)
  tokenizer.add_special_tokens([tokenizers.AddedToken('<mask>', lstrip=True)])
  tokenizer.post_processor = processors.RobertaProcessing(('</s>', 2), ('<s>', 0))
  return tokenizer


def rows(books, tokenizer: tokenizers.Tokenizer, seq_len: int) -> np.ndarray:
  """The books' tokens, documents separated by </s>, cut into rows of
  <s> + seq_len - 2 tokens + </s>."""
  stream = []
  for book in books:
    stream.extend(tokenizer.encode(book_text(book), add_special_tokens=False).ids)
    stream.append(2)
  body = seq_len - 2
  count = len(stream) // body
  cut = np.asarray(stream[: count * body], np.int64).reshape(count, body)
  return np.concatenate([np.zeros((count, 1), np.int64), cut, np.full((count, 1), 2)], axis=1)


def mean_loss(model, data, collator, batch_size: int, max_batches: int) -> float:
  model.eval()
  losses = []
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for start in range(0, min(len(data), batch_size * max_batches), batch_size):
      torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
      batch = collator([{'input_ids': row} for row in data[start : start + batch_size]])
      losses.append(model(**batch).loss.item())
  model.train()
  return float(np.mean(losses))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data', required=True, help='folder of the pg*.txt books')
  parser.add_argument('--out', required=True, help='the checkpoint folder to write')
  parser.add_argument('--steps', type=int, default=1500)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--seq_len', type=int, default=256)
  parser.add_argument('--vocab_size', type=int, default=8000)
  parser.add_argument('--learning_rate', type=float, default=1e-3)
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  if out.exists() and any(out.iterdir()):
    raise SystemExit(f'error: {out} exists and is not empty; pass a new --out.')
  books = sorted(pathlib.Path(args.data).glob('pg*.txt'))
  if not books:
    raise SystemExit(f'error: no pg*.txt books in {args.data}; pass the Gutenberg folder.')
  train_books = [book for book in books if book.name not in HELD_OUT]
  validation_books = [book for book in books if book.name in VALIDATION]
  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)

  started = time.time()
  tokenizer = train_tokenizer(train_books, args.vocab_size)
  special = dict(
      bos_token='<s>',
      eos_token='</s>',
      cls_token='<s>',
      sep_token='</s>',
      pad_token='<pad>',
      unk_token='<unk>',
      mask_token='<mask>',
  )
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
  train = rows(train_books, tokenizer, args.seq_len)
  validation = rows(validation_books, tokenizer, args.seq_len)
  print(
      f'{len(train_books)} training books: {len(train):,} rows of {args.seq_len} tokens; '
      f'{len(validation):,} validation rows; tokenizer {time.time() - started:.0f} s',
      flush=True,
  )

  config = transformers.RobertaConfig(
      vocab_size=tokenizer.get_vocab_size(),
      hidden_size=128,
      num_hidden_layers=3,
      num_attention_heads=4,
      intermediate_size=512,
      hidden_act='gelu',
      max_position_embeddings=args.seq_len + 2,
      type_vocab_size=1,
      layer_norm_eps=1e-5,
      pad_token_id=1,
      bos_token_id=0,
      eos_token_id=2,
  )
  model = transformers.RobertaForMaskedLM(config)
  collator = transformers.DataCollatorForLanguageModeling(fast, mlm_probability=0.15)
  decay = [p for n, p in model.named_parameters() if p.ndim > 1 and 'embeddings' not in n]
  rest = [p for n, p in model.named_parameters() if not (p.ndim > 1 and 'embeddings' not in n)]
  optimizer = torch.optim.AdamW(
      [{'params': decay, 'weight_decay': 0.01}, {'params': rest, 'weight_decay': 0.0}],
      lr=args.learning_rate,
      betas=(0.9, 0.98),
      eps=1e-6,
  )
  schedule = transformers.get_linear_schedule_with_warmup(
      optimizer, max(1, int(0.06 * args.steps)), args.steps
  )
  order = np.random.default_rng(args.seed).permutation(len(train))
  model.train()
  started = time.time()
  for step in range(1, args.steps + 1):
    picked = order[np.arange((step - 1) * args.batch_size, step * args.batch_size) % len(train)]
    batch = collator([{'input_ids': row} for row in train[picked]])
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    if step % 100 == 0 or step == args.steps:
      print(
          f'step {step}/{args.steps} | loss {loss.item():.3f} | {time.time() - started:.0f} s',
          flush=True,
      )
  train_seconds = time.time() - started
  validation_loss = mean_loss(model, validation, collator, args.batch_size, max_batches=50)
  print(
      f'validation masked-LM loss {validation_loss:.4f} (perplexity {np.exp(validation_loss):.1f})',
      flush=True,
  )

  out.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(out)
  fast.save_pretrained(out)
  for extra in ('special_tokens_map.json', 'generation_config.json'):
    (out / extra).unlink(missing_ok=True)
  (out / 'training.json').write_text(
      json.dumps(
          dict(
              vars(args),
              train_rows=len(train),
              train_seconds=round(train_seconds),
              validation_loss=validation_loss,
              torch=torch.__version__,
              transformers=transformers.__version__,
          ),
          indent=2,
      )
  )
  print(f'wrote {out}', flush=True)


if __name__ == '__main__':
  main()
