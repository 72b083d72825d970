"""Weight sync of LoRA versions into a live vLLM server, beside the full delta it replaces.

For the model `bench/weight_sync.py` uses (bench-0.5b by default), start one vLLM server with
run-time adapters (`rlgw backend`'s launcher with `lora_rank`: --enable-lora, --max-lora-rank,
VLLM_ALLOW_RUNTIME_LORA_UPDATING), then for each rank make a peft adapter with random non-zero
B matrices on peft's default targets (q_proj, v_proj for Qwen2), and drive the swap steps of the
weight-update seam directly (`trainer/weight_update/lora.py`; no database): stage (checks the
folder; a client keeps sending requests meanwhile), pause(wait), apply (/v1/load_lora_adapter
under `bench@vN`), reset_prefix_cache, resume, parity probe of the adapter against a
transformers fp32 forward pass of base + adapter, judged by the coordinator's rule (the noise
band measured on the server: 1e-4 in fp32), commit (the previous adapter unloaded) or roll back
(`bench/swap_timing.py`).

    .venv/bin/python bench/weight_sync_lora.py [--preset bench-0.5b] [--ranks 8,64]
        [--dtypes float32,bfloat16] [--repeats 3]

Writes bench/results/weight_sync_lora.json (one row per rank, dtype and repeat, with the keys
method, dtype, bytes_shipped, stage_s, pause_ms, out_of_service_s, verify_s,
slowest_request_during_stage_s, unloaded_latency_s) and prints a markdown table. The full
delta's bytes are those of bench/weight_sync.py's delta file: every parameter in fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.processes import log  # noqa: E402
from bench.swap_timing import SERVED_NAME, timed_swap, unloaded_latency  # noqa: E402
from bench.weight_sync import machine, versions, wait_for_memory  # noqa: E402
from rlgw.adapters import LoraSpec  # noqa: E402
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy  # noqa: E402
from rlgw.ports import free_port  # noqa: E402
from trainer.backends.parity import reference_scores, served_scores  # noqa: E402
from trainer.backends.vllm_control import VllmControl  # noqa: E402
from trainer.models.init_model import PRESETS, create_model  # noqa: E402
from trainer.models.lora import with_adapter  # noqa: E402
from trainer.models.weights import load_reference_model  # noqa: E402
from trainer.swap.verification import tolerance_for  # noqa: E402
from trainer.weight_update.lora import LoraAdapter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync_lora.json"
PARITY_TOL = 1e-4  # fp32 (settings.parity_tolerance); other dtypes: the measured noise band
TARGET_BYTES_SHARE = 0.02  # of the full delta's
TARGET_PAUSE_MS = 50.0


def make_adapter(model_dir: Path, rank: int, seed: int, out: Path):
    """A peft adapter of `rank` with random B (A is peft's random init): saved at `out`; returns
    the probe scores of base + adapter (the trainer's reference)."""
    torch.manual_seed(seed)
    model = with_adapter(load_reference_model(model_dir), LoraSpec(rank, 2.0 * rank))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.save_pretrained(str(out))
    scores = reference_scores(model)
    del model
    return scores


def bench_dtype(model_dir: Path, dtype: str, ranks: list[int], work: Path, args, http) -> list:
    """One server in `dtype`: `--repeats` adapters per rank, each a new version, each judged by
    the coordinator's rule against the noise measured on this server."""
    wait_for_memory(args.min_free_gib)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log(f"{dtype}: starting vLLM with adapters up to rank {max(ranks)} on port {port}")
    proc = start_backend(
        model_dir,
        port,
        served_model_name=SERVED_NAME,
        log_path=work / f"vllm-{dtype}.log",
        dtype=dtype,
        lora_rank=max(ranks),
    )
    rows = []
    try:
        wait_healthy(url, timeout_s=900, proc=proc)
        vllm = VllmControl(http, url)
        unloaded_latency(http, url, SERVED_NAME, count=2)  # warm-up
        current = reference_scores(load_reference_model(model_dir))  # the base, served now
        noise = served_scores(http, url, SERVED_NAME).max_abs_diff(current)
        version, served = 0, 0
        for rank in ranks:
            for i in range(args.repeats):
                version += 1
                folder = work / f"{dtype}-r{rank}-v{version}"
                reference = make_adapter(model_dir, rank, seed=version, out=folder)
                update = LoraAdapter(folder, SERVED_NAME, version)
                idle = unloaded_latency(http, url, update.served_name(SERVED_NAME, served))
                swap = timed_swap(
                    vllm,
                    update,
                    reference,
                    old_reference=current,
                    tolerance=tolerance_for(dtype, noise, PARITY_TOL),
                    version=version,
                    old_version=served,
                )
                if swap["parity_ok"]:
                    served, current, noise = version, reference, swap["parity_max_diff"]
                row = {"method": f"lora-r{rank}", "dtype": dtype, **swap}
                row["unloaded_latency_s"] = idle
                row["repeat"] = i
                rows.append(row)
                log(
                    f"{dtype} rank {rank} #{i + 1}: {row['bytes_shipped'] / 1e6:.2f} MB, stage "
                    f"{row['stage_s']:.4f}s, pause {row['pause_ms']:.1f} ms, out of service "
                    f"{row['out_of_service_s']:.3f}s, verify {row['verify_s']:.3f}s, parity "
                    f"{row['parity_max_diff']:.1e} (band {row['tolerance']:.1e}: "
                    f"{'accepted' if row['parity_ok'] else 'refused'}), slowest request in "
                    f"stage {row['slowest_request_during_stage_s'] or 0:.3f}s (unloaded "
                    f"{idle:.3f}s)"
                )
    finally:
        stop_backend(proc)
    return rows


def table(rows: list[dict], full_bytes: int) -> str:
    lines = [
        "| method | dtype | bytes shipped (share of full delta) | stage s | pause ms "
        "| out of service s | verify s | slowest request in stage s | unloaded latency s "
        "| parity max diff |",
        "|" + "---|" * 10,
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["dtype"]), []).append(r)
    for (method, dtype), rs in groups.items():

        def med(key: str, rs=rs) -> float:
            return statistics.median(r[key] or 0.0 for r in rs)

        b = rs[0]["bytes_shipped"]
        lines.append(
            f"| {method} | {dtype} | {b / 1e6:.2f} MB ({100 * b / full_bytes:.2f}%) "
            f"| {med('stage_s'):.4f} | {med('pause_ms'):.1f} | {med('out_of_service_s'):.3f} "
            f"| {med('verify_s'):.3f} | {med('slowest_request_during_stage_s'):.3f} "
            f"| {med('unloaded_latency_s'):.3f} | {max(r['parity_max_diff'] for r in rs):.1e} |"
        )
    lines.append("")
    lines.append(f"Medians over the repeats; the full delta is {full_bytes / 1e6:.0f} MB (fp32).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--ranks", default="8,64")
    parser.add_argument("--dtypes", default="float32", help="float32 and/or bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, help="where the model and adapters go")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--min-free-gib", type=float, default=8.0)
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]

    temp = None if args.work else tempfile.TemporaryDirectory(prefix="rlgw-weight-sync-lora-")
    work = args.work or Path(temp.name)
    work.mkdir(parents=True, exist_ok=True)
    started, load_before = datetime.now(UTC), os.getloadavg()
    try:
        model_dir = work / "model"
        if not (model_dir / "config.json").is_file():
            log(f"creating {args.preset}")
            create_model(model_dir, args.preset, seed=0, overwrite=True)
        params = sum(p.numel() for p in load_reference_model(model_dir).parameters())
        full_bytes = 4 * params  # bench/weight_sync.py's delta: every parameter, fp32
        rows = []
        with httpx.Client(timeout=900.0) as http:
            for dtype in dtypes:
                rows += bench_dtype(model_dir, dtype, ranks, work, args, http)
    finally:
        if temp is not None:
            temp.cleanup()
    for r in rows:
        r["share_of_full_delta"] = r["bytes_shipped"] / full_bytes
    report = {
        "benchmark": "weight_sync_lora",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(
            ["python bench/weight_sync_lora.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine(),
        "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
        "versions": versions(),
        "preset": args.preset,
        "params": params,
        "full_delta_bytes": full_bytes,
        "targets": {"bytes_share_max": TARGET_BYTES_SHARE, "pause_ms_max": TARGET_PAUSE_MS},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(rows, full_bytes))
    fp32 = [r for r in rows if r["dtype"] == "float32"]
    if fp32:
        share = max(r["share_of_full_delta"] for r in fp32)
        pause = statistics.median(r["pause_ms"] for r in fp32)
        print(
            f"\ntarget bytes <= {100 * TARGET_BYTES_SHARE:.0f}% of the full delta: "
            f"{'met' if share <= TARGET_BYTES_SHARE else 'MISSED'} ({100 * share:.2f}%); "
            f"target pause <= {TARGET_PAUSE_MS:.0f} ms: "
            f"{'met' if pause <= TARGET_PAUSE_MS else 'MISSED'} ({pause:.1f} ms median)"
        )
    log(f"load average at start {load_before[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    log(f"wrote {args.out}")
    return 0 if all(r["parity_ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
