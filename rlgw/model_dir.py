"""A user's model directory: is it a Hugging Face causal LM that vLLM and transformers can load?
Checked before anything starts (the tool-call parser is chosen in rlgw/tool_parsers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
ON_DISK_DTYPES = ("float32", "bfloat16", "float16")


class ModelDirError(ValueError):
    """The directory cannot be served and trained: the message says why, in one line."""


@dataclass(frozen=True)
class ModelDir:
    path: Path
    architecture: str  # config.architectures[0], e.g. Qwen2ForCausalLM
    model_type: str  # config.model_type, e.g. qwen2
    dtype_on_disk: str | None  # config.torch_dtype (or dtype)
    max_positions: int | None


def inspect_model_dir(path: Path | str) -> ModelDir:
    """The directory's model, or ModelDirError naming the first thing that is missing or wrong."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ModelDirError(f"no model directory at {root}")
    try:
        config = json.loads((root / "config.json").read_text())
    except FileNotFoundError:
        raise ModelDirError(f"{root} has no config.json: not a Hugging Face model") from None
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{root}/config.json cannot be read: {exc}") from None
    architectures = config.get("architectures") or []
    architecture = str(architectures[0]) if architectures else ""
    if not architecture.endswith(CAUSAL_LM_SUFFIXES):
        raise ModelDirError(
            f"{root} holds a {architecture or 'model without architectures'}, "
            "not a causal language model (…ForCausalLM)"
        )
    if not (any(root.glob("*.safetensors")) or (root / "model.safetensors.index.json").exists()):
        raise ModelDirError(f"{root} holds no safetensors weights")
    if not ((root / "tokenizer.json").exists() or (root / "tokenizer_config.json").exists()):
        raise ModelDirError(f"{root} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    positions = config.get("max_position_embeddings")
    return ModelDir(
        path=root,
        architecture=architecture,
        model_type=str(config.get("model_type", "")),
        dtype_on_disk=config.get("torch_dtype") or config.get("dtype"),
        max_positions=int(positions) if isinstance(positions, int) else None,
    )


def check_servable(model: ModelDir, *, python: str = sys.executable) -> str | None:
    """ModelDirError when this machine's vLLM cannot serve the architecture; a notice (not an
    error) when vLLM is not installed here, so a gateway-only host can still register it."""
    probe = (
        "import json; from vllm import ModelRegistry; "
        "print(json.dumps(sorted(ModelRegistry.get_supported_archs())))"
    )
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not ask vLLM which architectures it serves ({exc})"
    if done.returncode != 0 and "No module named 'vllm'" in done.stderr:
        return "vLLM is not installed here: the architecture was not checked"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"could not ask vLLM which architectures it serves ({last})"
    supported = json.loads(done.stdout.strip().splitlines()[-1])
    if model.architecture not in supported:
        raise ModelDirError(f"{model.path} is a {model.architecture}, which this vLLM cannot serve")
    return None
