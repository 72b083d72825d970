"""Process helpers shared by the benchmarks: timestamped progress lines, free ports, and servers
started in their own process group, waited for until a URL answers, and stopped with the group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from rlgw.ports import free_port  # noqa: F401 - weight_sync.py, gateway_overhead.py import it here


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def start_server(
    cmd: list[str],
    *,
    env: dict[str, str],
    log_path: Path,
    ready_url: str,
    name: str,
    timeout_s: float,
    poll_s: float = 0.2,
) -> subprocess.Popen:
    """Start `cmd` in a session of its own (its workers share the group), output to `log_path`;
    return once GET `ready_url` answers 200. On exit or timeout, stop it and raise RuntimeError
    with the end of its log."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(ready_url, timeout=1.0, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} did not start (log {log_path}):\n{tail}")
        time.sleep(poll_s)


def stop_group(proc: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of `proc`, SIGKILL it if it has not exited in `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def serve_vllm(
    model_dir: Path, name: str, log_path: Path, **launch
) -> tuple[subprocess.Popen, str]:
    """A vLLM server of `model_dir` as the gateway's launcher starts it (`launch`: its keyword
    arguments, e.g. extra_args), healthy: (its process, its URL)."""
    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log(f"starting vLLM of {model_dir.name} on port {port}")
    proc = start_backend(model_dir, port, served_model_name=name, log_path=log_path, **launch)
    try:
        wait_healthy(url, timeout_s=600, proc=proc)
    except BaseException:
        stop_backend(proc)
        raise
    return proc, url
