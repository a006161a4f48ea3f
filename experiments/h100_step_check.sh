#!/usr/bin/env bash
# The measurements of docs/benchmarks.md's "Training throughput on an H100", for
# RoBERTa's three dropout rates, in one call of about 8 minutes on one H100:
#
#   bash experiments/h100_step_check.sh > h100_step.txt 2>&1
#
# Installs JAX's CUDA plugin into .venv (make venv-gpu), then times the step
# of configs/roberta_base_throughput.py with experiments/gpu_step_profile.py:
# the dropout of before (on the MLP's hidden, none on P; cuDNN attention), RoBERTa's
# (0.1 on P, so the einsums), RoBERTa's without attention dropout (cuDNN again),
# and RoBERTa's with rbg random bits; the Linformer and the Transformer at
# n = 512 (batch 64) and 4096 (batch 8). Each run prints 'RESULT {json}' and its
# kernel profile.
set -u
cd "$(dirname "$0")/.."
make venv-gpu >/dev/null || exit 1
profile() { .venv/bin/python -m experiments.gpu_step_profile --top=12 "$@"; }
before=(--attention_dropout=0.0 --activation_dropout=0.1)
for attention in linformer full; do
  profile --attention=$attention --max_len=512 --batch=64 "${before[@]}"
  profile --attention=$attention --max_len=512 --batch=64
  profile --attention=$attention --max_len=512 --batch=64 --attention_dropout=0.0
  JAX_DEFAULT_PRNG_IMPL=rbg profile --attention=$attention --max_len=512 --batch=64
  # At 4096 the Transformer's [n, n] weights do not fit with the einsums: no P dropout.
  profile --attention=$attention --max_len=4096 --batch=8 --attention_dropout=0.0
done
profile --attention=linformer --max_len=4096 --batch=8
