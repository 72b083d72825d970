"""Build, start, health-check and stop the vLLM OpenAI-compatible server that backs the gateway."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from rlgw.adapters import max_lora_rank
from rlgw.placement import Placement, pinned_argv
from rlgw.settings import Settings
from rlgw.tool_parsers import AUTO, choose_tool_parser

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
PLATFORMS = ("cpu", "gpu")
# 512 is too short with a byte-level tokenizer: one small tool schema makes a ~400-token prompt.
CPU_MAX_MODEL_LEN = 2048
# vLLM's prefix cache holds whole KV blocks only, and its CPU default block is 128 tokens: longer
# than most agents' prompts (the demo's is 38 with its chat template), so none was ever found in
# the cache. 32 is the smallest size the CPU attention kernels are tuned for (docs/benchmarks.md,
# "The prefix cache and the moments writer").
CPU_BLOCK_SIZE = 32
DEFAULT_LOG_LEVEL = "WARNING"
WORKER_EXTENSION = "rlgw_vllm.extension.WeightUpdateExtension"
# Adapters resident at once: the served one and the one a swap loads beside it.
MAX_LORAS = 2
PROGRESS_EVERY_S = 10.0


class BackendError(RuntimeError):
    """The vLLM backend failed to start or to become healthy. Its message is one line that names
    the log; the log's last lines are kept in `log_tail` for whoever wants more."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def detect_platform() -> str:
    """'gpu' when torch sees a CUDA device, else 'cpu'. RLGW_BACKEND_PLATFORM overrides."""
    forced = Settings().backend_platform.strip().lower()
    if forced:
        return _check_platform(forced)
    try:
        import torch
    except ImportError:
        return "cpu"
    return "gpu" if torch.cuda.is_available() else "cpu"


def _check_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, not {platform!r}")
    return platform


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


# The log-probs vLLM returns are those of the distribution it sampled from (after temperature,
# min-p, top-k and top-p; docs/training.md, "Behaviour log-probs and sampling settings"), not its
# default raw ones; and a field a request omits takes vLLM's neutral default, not the model's
# generation_config.json, so the settings the gateway records are the ones applied.
LOGPROBS_MODE = "processed_logprobs"
GENERATION_CONFIG = "vllm"


class BackendArgsError(ValueError):
    """Extra vLLM arguments that would make the recorded log-probs or sampling settings wrong."""


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` in `args` (`--flag value` or `--flag=value`), else None."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag:
            return args[i + 1] if i + 1 < len(args) else ""
    return None


def check_sampling_args(args: Sequence[str]) -> None:
    """Refuse extra arguments that change what a completion's recorded log-probs or sampling
    settings mean: another `--logprobs-mode` (raw log-probs are not the behaviour policy's at a
    temperature other than 1), another `--generation-config` or an `--override-generation-config`
    (defaults the gateway cannot see), a `--tool-strict-level` that constrains every tool call."""
    mode = _flag_value(args, "--logprobs-mode")
    if mode is not None and mode != LOGPROBS_MODE:
        raise BackendArgsError(
            f"--logprobs-mode {mode} would record log-probs of another distribution than the "
            f"one sampled from; the gateway needs --logprobs-mode {LOGPROBS_MODE}"
        )
    config = _flag_value(args, "--generation-config")
    if config is not None and config != GENERATION_CONFIG:
        raise BackendArgsError(
            f"--generation-config {config} would apply sampling defaults the gateway does not "
            f"record; the gateway needs --generation-config {GENERATION_CONFIG}"
        )
    if _flag_value(args, "--override-generation-config") is not None:
        raise BackendArgsError(
            "--override-generation-config would apply sampling defaults the gateway does not "
            "record: send the settings with each request instead"
        )
    strict = _flag_value(args, "--tool-strict-level")
    if strict is not None and strict != "auto":
        raise BackendArgsError(
            f"--tool-strict-level {strict} would constrain tool calls in a way the gateway does "
            "not record; leave it at auto"
        )


def backend_command(
    model_dir: Path | str,
    port: int,
    *,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    platform: str | None = None,
    extra_args: Sequence[str] = (),
    worker_extension: str | None = WORKER_EXTENSION,
    dtype: str | None = None,
    max_model_len: int | None = None,
    tool_call_parser: str | None = AUTO,
    log_level: str = DEFAULT_LOG_LEVEL,
    lora_rank: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The vLLM server argv and the environment variables to add for it.

    `extra_args` are appended last; a flag given there replaces the default of the same name
    (for --dtype and --max-model-len). `max_model_len` defaults to CPU_MAX_MODEL_LEN on the CPU
    and to the model's own limit on a GPU. `tool_call_parser` "auto" takes the parser that the
    checkpoint's tokenizer and template support (rlgw/tool_parsers.py; none when none fits), a
    named one is checked the same way (ToolParserError); None serves without tool calls.
    Log-probs are the processed ones and sampling defaults vLLM's own (LOGPROBS_MODE,
    GENERATION_CONFIG); extra arguments that change either are refused (`check_sampling_args`,
    BackendArgsError).
    `lora_rank` (a model trained with LoRA) turns on run-time adapters up to that rank (rounded
    up to a value vLLM accepts), two resident at once (the served one and the next).
    """
    model_dir = Path(model_dir).expanduser().resolve()
    platform = _check_platform(platform) if platform else detect_platform()
    extra = list(extra_args)
    check_sampling_args(extra)
    argv = [
        sys.executable,
        "-m",
        VLLM_MODULE,
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name or model_dir.name,
        "--host",
        host,
        "--port",
        str(port),
    ]
    parser = choose_tool_parser(model_dir, tool_call_parser).parser
    if parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if not _has_flag(extra, "--dtype"):
        argv += ["--dtype", dtype or ("float32" if platform == "cpu" else "bfloat16")]
    if platform == "cpu":
        argv.append("--enforce-eager")
        max_model_len = max_model_len or _cpu_max_model_len(model_dir)
        if not _has_flag(extra, "--block-size"):
            argv += ["--block-size", str(CPU_BLOCK_SIZE)]
    if max_model_len and not _has_flag(extra, "--max-model-len"):
        argv += ["--max-model-len", str(max_model_len)]
    if worker_extension:
        argv += ["--worker-extension-cls", worker_extension]
    if not _has_flag(extra, "--logprobs-mode"):
        argv += ["--logprobs-mode", LOGPROBS_MODE]
    if not _has_flag(extra, "--generation-config"):
        argv += ["--generation-config", GENERATION_CONFIG]
    if lora_rank:
        argv += ["--enable-lora", "--max-lora-rank", str(max_lora_rank(lora_rank))]
        argv += ["--max-loras", str(MAX_LORAS)]
    argv += extra
    env = backend_env(platform, log_level)
    if lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter
    return argv, env


def _cpu_max_model_len(model_dir: Path) -> int:
    """CPU_MAX_MODEL_LEN, or less when the model's config allows fewer positions."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        return min(CPU_MAX_MODEL_LEN, int(config["max_position_embeddings"]))
    except (OSError, ValueError, KeyError, TypeError):
        return CPU_MAX_MODEL_LEN


def backend_env(platform: str, log_level: str = DEFAULT_LOG_LEVEL) -> dict[str, str]:
    """Environment additions: dev-mode control endpoints, offline hub, CPU cache and threads."""
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_LOGGING_LEVEL": log_level.upper(),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    if platform == "cpu":
        # Our vLLM plugin keeps linear weights after CPU repacking, so they can be updated in place.
        env["RLGW_VLLM_KEEP_WEIGHTS"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def check_model_dir(model_dir: Path | str) -> Path:
    """The model directory, resolved; FileNotFoundError unless it holds a config.json."""
    path = Path(model_dir).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (expected {path / 'config.json'})")
    return path


def default_log_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"rlgw-vllm-{port}.log"


def start_backend(
    model_dir: Path | str,
    port: int,
    *,
    log_path: Path | str | None = None,
    placement: Placement | None = None,
    **command_kwargs,
) -> subprocess.Popen:
    """Start vLLM in a new process group; stdout and stderr go to log_path (a temp file if None).

    A separated `placement` pins the server (and the engine processes it spawns) to the backend
    cores. The log path is kept on the returned process as `proc.log_path` for `wait_healthy`.
    """
    argv, env_add = backend_command(check_model_dir(model_dir), port, **command_kwargs)
    if placement is not None:
        argv = pinned_argv(argv, placement.cpus("backend"))
        env_add = {**env_add, **placement.backend_env()}
    log_path = Path(log_path) if log_path else default_log_path(port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n[rlgw] starting: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env_add},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def log_tail(log_path: Path | str | None, lines: int = 40) -> str:
    """The last lines of a log file ('' when there is none)."""
    if not log_path or not Path(log_path).is_file():
        return ""
    text = Path(log_path).read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _probe(client: httpx.Client, base_url: str) -> bool:
    try:
        if client.get(f"{base_url}/health").status_code != 200:
            return False
        return client.get(f"{base_url}/v1/models").status_code == 200
    except httpx.HTTPError:
        return False


def _failure(message: str, log_path: Path | str | None) -> BackendError:
    where = f" (log: {log_path})" if log_path else ""
    error = BackendError(f"{message}{where}", log_tail(log_path))
    if error.log_tail:  # shown in a traceback (a test's failure), never in the CLI's one line
        error.add_note(f"--- last log lines ---\n{error.log_tail}")
    return error


def wait_healthy(
    url: str,
    timeout_s: float = 180,
    proc: subprocess.Popen | None = None,
    *,
    log_path: Path | str | None = None,
    poll_s: float = 0.5,
) -> None:
    """Block until GET /health and GET /v1/models answer 200, or raise BackendError."""
    base_url = url.rstrip("/")
    log_path = log_path or getattr(proc, "log_path", None)
    start = time.monotonic()
    next_report = start + PROGRESS_EVERY_S
    with httpx.Client(timeout=5.0) as client:
        while True:
            if proc is not None and proc.poll() is not None:
                raise _failure(f"vLLM exited with code {proc.returncode} before healthy", log_path)
            if _probe(client, base_url):
                print(
                    f"[backend] healthy at {base_url} after {time.monotonic() - start:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
                return
            now = time.monotonic()
            if now - start > timeout_s:
                raise _failure(f"vLLM at {base_url} not healthy after {timeout_s:.0f}s", log_path)
            if now >= next_report:
                print(
                    f"[backend] waiting for {base_url} ({now - start:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
                next_report = now + PROGRESS_EVERY_S
            time.sleep(poll_s)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def stop_backend(proc: subprocess.Popen, timeout_s: float = 20) -> int | None:
    """SIGTERM the server's process group, then SIGKILL what is left after timeout_s."""
    pgid = proc.pid  # start_new_session=True: the server leads its own group
    if proc.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
        time.sleep(0.1)
    if proc.poll() is None or _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    return proc.returncode


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_backend_foreground(
    model_dir: Path | str,
    port: int,
    *,
    log_path: Path | str | None = None,
    stop_timeout_s: float = 20,
    **command_kwargs,
) -> int:
    """Run vLLM until it exits, its output in `log_path`; forward SIGINT/SIGTERM/SIGHUP to it.
    A server that dies before it is healthy is a BackendError (one line naming the log).

    Returns vLLM's exit code (128 + signal number when it was killed by a signal).
    """
    proc = start_backend(model_dir, port, log_path=log_path, **command_kwargs)
    print(f"[backend] starting vLLM on port {port} (log: {proc.log_path})", file=sys.stderr)  # type: ignore[attr-defined]
    stopping = False

    def forward(signum: int, _frame) -> None:
        nonlocal stopping
        if stopping:  # a second signal: do not wait any longer
            _signal_group(proc.pid, signal.SIGKILL)
            return
        stopping = True
        _signal_group(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        host = command_kwargs.get("host", "127.0.0.1")
        with contextlib.suppress(BackendError):  # stopped by a signal while starting
            wait_healthy(f"http://{host}:{port}", timeout_s=600, proc=proc)
        if proc.poll() is not None and not stopping:
            raise _failure(f"vLLM exited with code {proc.returncode} before healthy", proc.log_path)  # type: ignore[attr-defined]
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if _group_alive(proc.pid):
            stop_backend(proc, stop_timeout_s)
    return 128 - rc if rc < 0 else rc
