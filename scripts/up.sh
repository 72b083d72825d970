#!/usr/bin/env bash
# The main job: creates the environment if missing, then `rlgw up` (embedded Postgres, a tiny local
# model, one vLLM CPU backend, the gateway on http://127.0.0.1:8000). Extra arguments go to rlgw up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"
exec "$ROOT/.venv/bin/rlgw" up "$@"
