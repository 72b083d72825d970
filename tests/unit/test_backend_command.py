"""`rlgw backend`'s vLLM command line and environment, for the CPU and the GPU builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgw.backend_launcher import (
    CPU_BLOCK_SIZE,
    CPU_MAX_MODEL_LEN,
    BackendArgsError,
    backend_command,
)


def _model(tmp_path: Path, positions: int = 32768, model_type: str = "qwen2") -> Path:
    config = {"max_position_embeddings": positions, "model_type": model_type}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_cpu_runs_fp32_eager_with_the_weight_plugin_and_a_bounded_context(tmp_path: Path) -> None:
    argv, env = backend_command(_model(tmp_path), 8100, platform="cpu", served_model_name="m")
    assert _value(argv, "--dtype") == "float32" and "--enforce-eager" in argv
    assert _value(argv, "--max-model-len") == str(CPU_MAX_MODEL_LEN)
    assert _value(argv, "--block-size") == str(CPU_BLOCK_SIZE) == "32"  # prompts fit the cache
    assert _value(argv, "--served-model-name") == "m" and _value(argv, "--port") == "8100"
    assert _value(argv, "--worker-extension-cls") == "rlgw_vllm.extension.WeightUpdateExtension"
    assert "--enable-auto-tool-choice" in argv and _value(argv, "--tool-call-parser")
    assert env["RLGW_VLLM_KEEP_WEIGHTS"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_KVCACHE_SPACE" in env


def test_cpu_context_never_exceeds_the_models_positions(tmp_path: Path) -> None:
    argv, _ = backend_command(_model(tmp_path, positions=256), 8100, platform="cpu")
    assert _value(argv, "--max-model-len") == "256"


def test_gpu_runs_bf16_with_cuda_graphs_and_the_models_own_context(tmp_path: Path) -> None:
    argv, env = backend_command(_model(tmp_path), 8100, platform="gpu")
    assert _value(argv, "--dtype") == "bfloat16" and "--enforce-eager" not in argv
    assert "--max-model-len" not in argv and "--block-size" not in argv  # vLLM's own on a GPU
    assert _value(argv, "--worker-extension-cls") == "rlgw_vllm.extension.WeightUpdateExtension"
    assert "RLGW_VLLM_KEEP_WEIGHTS" not in env and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_flags_given_by_the_user_replace_the_defaults(tmp_path: Path) -> None:
    extra = ["--dtype", "float16", "--max-model-len", "1024", "--block-size=128"]
    argv, _ = backend_command(_model(tmp_path), 8100, platform="cpu", extra_args=extra)
    assert "--block-size" not in argv and argv[-1] == "--block-size=128"
    assert argv.count("--dtype") == 1 and _value(argv, "--dtype") == "float16"
    assert argv.count("--max-model-len") == 1 and _value(argv, "--max-model-len") == "1024"


def test_the_tool_call_parser_follows_the_model_family_or_the_flag(tmp_path: Path) -> None:
    llama, _ = backend_command(_model(tmp_path, model_type="llama"), 8100, platform="cpu")
    assert _value(llama, "--tool-call-parser") == "llama3_json"
    named, _ = backend_command(_model(tmp_path), 8100, platform="cpu", tool_call_parser="pythonic")
    assert _value(named, "--tool-call-parser") == "pythonic"
    unknown, _ = backend_command(_model(tmp_path, model_type="gpt2"), 8100, platform="cpu")
    assert "--tool-call-parser" not in unknown and "--enable-auto-tool-choice" not in unknown
    off, _ = backend_command(_model(tmp_path), 8100, platform="cpu", tool_call_parser=None)
    assert "--enable-auto-tool-choice" not in off


def test_a_lora_model_gets_run_time_adapters_up_to_an_accepted_rank(tmp_path: Path) -> None:
    argv, env = backend_command(_model(tmp_path), 8100, platform="cpu", lora_rank=12)
    assert "--enable-lora" in argv and _value(argv, "--max-lora-rank") == "16"
    assert _value(argv, "--max-loras") == "2"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain, plain_env = backend_command(_model(tmp_path), 8100, platform="cpu")
    assert "--enable-lora" not in plain and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain_env


def test_backends_report_processed_logprobs_and_vllms_own_sampling_defaults(tmp_path: Path) -> None:
    for platform in ("cpu", "gpu"):
        argv, _ = backend_command(_model(tmp_path), 8100, platform=platform)
        assert _value(argv, "--logprobs-mode") == "processed_logprobs"
        assert _value(argv, "--generation-config") == "vllm"
    same = ["--logprobs-mode=processed_logprobs", "--generation-config", "vllm"]
    argv, _ = backend_command(_model(tmp_path), 8100, platform="cpu", extra_args=same)
    assert argv.count("--logprobs-mode") + argv.count("--logprobs-mode=processed_logprobs") == 1
    assert argv.count("--generation-config") == 1


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--logprobs-mode", "raw_logprobs"], "--logprobs-mode raw_logprobs"),
        (["--logprobs-mode=processed_logits"], "--logprobs-mode processed_logits"),
        (["--generation-config", "auto"], "--generation-config auto"),
        (["--override-generation-config", '{"temperature": 0.5}'], "override-generation-config"),
        (["--tool-strict-level", "parameter"], "--tool-strict-level parameter"),
    ],
)
def test_extra_args_that_would_make_the_record_wrong_are_refused(tmp_path, extra, named) -> None:
    with pytest.raises(BackendArgsError, match=named):
        backend_command(_model(tmp_path), 8100, platform="cpu", extra_args=extra)
