"""Weight sync over HTTP vs from a path: the same verified delta swap, the file read by the worker
from the trainer's path or downloaded from the trainer's version-file server (bearer token,
sha256 checked before a tensor is read).

One vLLM server (`rlgw backend`'s launcher) with the model of `bench/weight_sync.py` (its
functions are reused), a version-file server over a temporary state directory, and for each
repeat one swap per method, alternating +delta / -delta: stage (outside the pause; for HTTP it
includes the download and the checksum), pause(wait), apply, reset_prefix_cache, resume, parity
probe against a transformers fp32 forward pass. Requests are sent back to back during the stage.

    .venv/bin/python bench/weight_sync_http.py [--preset tiny|bench-0.5b] [--repeats 3]

Writes bench/results/weight_sync_http.json: one row per swap with method, dtype,
bytes_shipped, stage_s, pause_ms, out_of_service_s, verify_s, slowest_request_during_stage_s,
unloaded_latency_s (and the worker's download seconds and parity).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.processes import free_port, log  # noqa: E402
from bench.swap_timing import ROW_KEYS, SERVED_NAME, timed_swap  # noqa: E402
from bench.weight_sync import (  # noqa: E402
    PARITY_TOL,
    add_to,
    machine,
    random_delta,
    start_and_time,
    versions,
    wait_for_memory,
)
from rlgw.backend_launcher import stop_backend  # noqa: E402
from trainer.backends.parity import reference_scores, served_scores  # noqa: E402
from trainer.backends.vllm_control import VllmControl  # noqa: E402
from trainer.models.init_model import PRESETS, create_model  # noqa: E402
from trainer.models.weights import load_reference_model  # noqa: E402
from trainer.publishing.version_files import VersionFileServer, version_url  # noqa: E402
from trainer.publishing.versions import file_sha256, version_file  # noqa: E402
from trainer.swap.verification import tolerance_for  # noqa: E402
from trainer.weight_update.base import WeightUpdate  # noqa: E402
from trainer.weight_update.files import DeltaFile  # noqa: E402
from trainer.weight_update.remote import RemoteDelta  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "weight_sync_http.json"
METHODS = ("path", "http")


@dataclass(frozen=True)
class Offer:
    """The +delta and -delta files on the trainer's side, and where the version-file server
    offers them to the backend."""

    files: dict[int, Path]  # sign -> path
    sums: dict[int, str]  # sign -> sha256
    base: str  # the version-file server's URL
    token: str
    downloads: Path  # the backend's download folder

    def update(self, method: str, sign: int) -> WeightUpdate:
        if method == "path":
            return DeltaFile(self.files[sign])
        # A fresh download every time: the worker keeps a verified file for a retry of the same
        # version, which would ship nothing here.
        shutil.rmtree(self.downloads, ignore_errors=True)
        url = version_url(self.base, SERVED_NAME, 1 if sign > 0 else 2, "delta")
        return RemoteDelta(self.files[sign], url, self.sums[sign], self.token, offer_path=False)


def run(args, work: Path) -> list[dict]:
    model_dir = work / "model"
    log(f"{args.preset}: creating the model")
    create_model(model_dir, args.preset, seed=0, overwrite=True)
    delta = random_delta(load_reference_model(model_dir), seed=1234, scale=args.scale)
    trainer_home = work / "trainer-home"
    files = {
        +1: version_file(trainer_home, SERVED_NAME, 1, "delta"),
        -1: version_file(trainer_home, SERVED_NAME, 2, "delta"),
    }
    files[1].parent.mkdir(parents=True, exist_ok=True)
    DeltaFile.write(delta, files[1])
    DeltaFile.write({k: -v for k, v in delta.items()}, files[-1])
    sums = {sign: file_sha256(path) for sign, path in files.items()}
    token = secrets.token_urlsafe(32)
    os.environ["RLGW_HOME"] = str(work / "backend-home")  # the backend's downloads go there

    rows: list[dict] = []
    with (
        httpx.Client(timeout=900.0) as http,
        VersionFileServer(trainer_home, "127.0.0.1:0", token) as server,
    ):
        downloads = work / "backend-home" / "downloads"
        offer = Offer(files, sums, f"http://{server.bound}", token, downloads)
        for dtype in args.dtypes:
            wait_for_memory(args.min_free_gib)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log_path = work / f"vllm-{dtype}.log"
            proc, healthy_s, _ = start_and_time(model_dir, port, log_path, http, None, dtype)
            log(f"{args.preset} {dtype}: vLLM healthy after {healthy_s:.1f}s")
            try:
                # The server starts from the checkpoint: so does the trainer's side.
                reference_model = load_reference_model(model_dir)
                rows += swaps(args, VllmControl(http, url), dtype, reference_model, delta, offer)
            finally:
                stop_backend(proc)
    return rows


def swaps(args, vllm: VllmControl, dtype: str, reference_model, delta, offer: Offer) -> list:
    """`--repeats` swaps per method on one server, alternating +delta / -delta, each judged by
    the coordinator's rule against the noise measured on this server."""
    current = reference_scores(reference_model)
    noise = served_scores(vllm.http, vllm.url, SERVED_NAME).max_abs_diff(current)
    rows, sign, version = [], 1, 0
    for i in range(args.repeats):
        for method in METHODS:
            add_to(reference_model, delta, sign)
            reference = reference_scores(reference_model)
            swap = timed_swap(
                vllm,
                offer.update(method, sign),
                reference,
                old_reference=current,
                tolerance=tolerance_for(dtype, noise, PARITY_TOL),
                version=version + 1,
                old_version=version,
            )
            worker = swap["worker_stage"] or {}
            row = {"method": method, "dtype": dtype, "repeat": i, **swap}
            row["unloaded_latency_s"] = swap["usual_latency_s"]
            row["download_s"] = (worker.get("fetch") or {}).get("seconds")
            row["delivery"] = swap["delivery"] or "path"
            rows.append(row)
            log(
                f"{dtype} {method:>4}: shipped {row['bytes_shipped'] / 1e6:.1f} MB, stage "
                f"{row['stage_s']:.3f}s (download {row['download_s'] or 0:.3f}s), "
                f"pause {row['pause_ms']:.1f} ms, out of service "
                f"{row['out_of_service_s']:.3f}s, verify {row['verify_s']:.3f}s, "
                f"slowest request in stage {row['slowest_request_during_stage_s'] or 0:.3f}"
                f"s (unloaded {row['unloaded_latency_s'] or 0:.3f}s), parity "
                f"{row['parity_max_diff']:.1e} (band {row['tolerance']:.1e})"
            )
            if row["parity_ok"]:
                sign, version = -sign, version + 1
                current, noise = reference, row["parity_max_diff"]
            else:
                add_to(reference_model, delta, -sign)  # the server rolled back
    return rows


def table(rows: list[dict]) -> str:
    keys = ROW_KEYS[2:]  # the shared row, after method and dtype
    lines = ["| method | dtype | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for method in METHODS:
            mine = [r for r in rows if r["method"] == method and r["dtype"] == dtype]
            cells = [
                f"{statistics.median(r[k] or 0 for r in mine):.4g}" for k in keys
            ]  # medians over the repeats
            lines.append(f"| {method} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32", help="float32 and/or bfloat16")
    parser.add_argument("--scale", type=float, default=0.25, help="delta std = 0.02 * scale")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--min-free-gib", type=float, default=4.0)
    parser.add_argument("--work", type=Path, help="where the model, files and logs go (kept)")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    started, load_before = datetime.now(UTC), os.getloadavg()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        rows = run(args, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="rlgw-weight-http-") as temp:
            rows = run(args, Path(temp))
    report = {
        "benchmark": "weight_sync_http",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(
            ["python bench/weight_sync_http.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "preset": args.preset,
        "machine": machine(),
        "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
        "versions": versions(),
        "parity_tolerance": PARITY_TOL,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(table(rows))
    print()
    log(f"load average at start {load_before[0]:.1f}, at end {os.getloadavg()[0]:.1f}")
    log(f"wrote {args.out}")
    return 0 if all(r["parity_ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
