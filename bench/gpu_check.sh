#!/usr/bin/env bash
# The GPU proof in one command, from the repo root on the borrowed GPU box (torch + CUDA,
# transformers, peft; no vLLM, no Postgres, no network): runs bench/gpu_check.py on cuda:0 and
# leaves its JSON on stdout and in $OUT/gpu_check.json. Extra arguments go to gpu_check.py
# (e.g. --sizes smollm2 for the default model's shape alone, --max-seconds 300). Exits 1 if a
# configuration failed (its error is in the JSON), 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" bench/gpu_check.py --device cuda --max-seconds "${MAX_SECONDS:-420}" "$@"
