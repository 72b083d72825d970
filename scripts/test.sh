#!/usr/bin/env bash
# Runs the test suite: creates the environment if missing, then pytest against real Postgres and a
# real vLLM CPU server. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh"

# CI validates docker-compose.yml with Debian's docker-compose (no Docker engine is needed).
if [[ "${CI:-}" == "true" ]] && ! command -v docker-compose >/dev/null && command -v apt-get >/dev/null; then
    echo "[test] installing docker-compose for the compose-file check"
    (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null) \
        || echo "[test] docker-compose unavailable; tests/test_compose.py will skip"
fi
# CI loads the dashboard in Debian's headless chromium, driven through its chromedriver.
if [[ "${CI:-}" == "true" ]] && ! command -v chromedriver >/dev/null && command -v apt-get >/dev/null; then
    echo "[test] installing chromium and chromium-driver for the dashboard test"
    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "[test] chromium unavailable; tests/test_dashboard.py will skip its browser test"
fi

cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
