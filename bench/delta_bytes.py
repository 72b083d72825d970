"""What a full-weight version's delta is made of, measured on real version files: per tensor, the
fraction of exactly-zero elements, its bytes in fp32, in bf16 and zstd-compressed, and what storing
it in bf16 does to the served log-probs against the parity tolerance.

Reads a state directory's version files in order (`<home>/versions/<model>/v*-{delta,full}`; a
linear history: each version's parent is the one before), rebuilds every version from the base
checkpoint, and for each delta compares the probe (trainer/backends/parity.py) on parent + delta
(fp32, what the trainer shipped) with parent + bf16(delta). Read only: nothing under --versions
is written.

    .venv/bin/python bench/delta_bytes.py --base CHECKPOINT_DIR --versions HOME/versions/MODEL

JSON goes to bench/results/delta_bytes.json (or --out); a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.backends.parity import reference_scores  # noqa: E402
from trainer.models.weights import (  # noqa: E402
    adopt_delta,
    apply_delta,
    delta,
    load_full,
    load_reference_model,
    read_update,
    state_dict,
    write_update,
)
from trainer.publishing.versions import file_sha256  # noqa: E402

PARITY_TOLERANCE = 1e-4  # rlgw/settings.py's default, the fp32 band (trainer/swap/verification.py)
ZSTD_LEVEL = 3  # zstandard's default level
_FILE = re.compile(r"^v(\d{6})-(delta|full)\.safetensors$")


def role(name: str) -> str:
    """A tensor's kind, to sum a model's many layers: embed, q/k/v/o, gate/up/down, norm..."""
    for key in ("embed", "lm_head", "q_proj", "k_proj", "v_proj", "o_proj"):
        if key in name:
            return key
    for key in ("gate_proj", "up_proj", "down_proj"):
        if key in name:
            return key
    return "norm" if "norm" in name else "other"


def zstd_size(data: bytes) -> tuple[int, float]:
    import zstandard

    start = time.perf_counter()
    size = len(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))
    return size, time.perf_counter() - start


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def measure_tensor(value: torch.Tensor) -> dict:
    """The numbers of one tensor of a delta (fp32)."""
    rounded = value.to(torch.bfloat16)
    error = (rounded.float() - value).abs()
    fp32, bf16 = tensor_bytes(value), tensor_bytes(rounded)
    zfp32, tfp32 = zstd_size(fp32)
    zbf16, tbf16 = zstd_size(bf16)
    rows_zero = int((value == 0).all(dim=-1).sum()) if value.dim() == 2 else 0
    return {
        "elements": value.numel(),
        "zero": int((value == 0).sum()),
        "rows": value.shape[0] if value.dim() == 2 else 0,
        "rows_zero": rows_zero,
        "fp32": len(fp32),
        "bf16": len(bf16),
        "zstd_fp32": zfp32,
        "zstd_bf16": zbf16,
        "zstd_s": tfp32 + tbf16,
        "abs_max": float(value.abs().max()),
        "bf16_err_max": float(error.max()),
        "sq": float(value.double().pow(2).sum()),
        "err_sq": float(error.double().pow(2).sum()),
    }


def version_files(folder: Path) -> list[tuple[int, str, Path]]:
    found = []
    for path in folder.iterdir():
        match = _FILE.match(path.name)
        if match:
            found.append((int(match[1]), match[2], path))
    return sorted(found)


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def time_payload(model: torch.nn.Module, parent: dict, scratch: Path, repeats: int) -> dict:
    """Seconds of a version's payload from `model`'s weights (the version) against `parent`
    (the served ones), as the trainer makes it (trainer/loop/payload.py, Publisher.record):
    delta (and, in bf16, the reference's adoption), write, checksum; then zstd on the bf16 file.
    The model's weights are put back after each bf16 adoption."""
    import zstandard

    new = {k: v.clone() for k, v in state_dict(model).items()}
    out: dict = {}
    path = scratch / "delta-timing.safetensors"
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        laps: dict[str, list[float]] = defaultdict(list)
        for _ in range(repeats):
            t0 = time.perf_counter()
            update = delta(new, parent, dtype)
            if dtype != torch.float32:
                adopt_delta(model, parent, update)
            t1 = time.perf_counter()
            size = write_update(update, path)
            t2 = time.perf_counter()
            file_sha256(path)
            t3 = time.perf_counter()
            laps["delta"].append(t1 - t0)
            laps["write"].append(t2 - t1)
            laps["checksum"].append(t3 - t2)
            del update
            load_full(model, new)
        out[name] = {"bytes": size, **{k: median(v) for k, v in laps.items()}}
    data = path.read_bytes()  # the bf16 file, the last written
    t0 = time.perf_counter()
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1).compress(data)
    t1 = time.perf_counter()
    zstandard.ZstdDecompressor().decompress(packed)
    t2 = time.perf_counter()
    out["zstd_bf16_file"] = {"bytes": len(packed), "compress": t1 - t0, "decompress": t2 - t1}
    path.unlink()
    return out


def measure(base: Path, folder: Path, limit: int, timing: tuple[Path, int] | None = None) -> dict:
    """The numbers of the first `limit` deltas; with `timing` (scratch folder, repeats), also
    the payload's seconds for the last of them."""
    report: dict = {}
    model = load_reference_model(base)
    files = version_files(folder)
    measured = [number for number, kind, _ in files if kind == "delta"][:limit]
    versions, by_role = [], defaultdict(lambda: defaultdict(float))
    previous = 0
    for number, kind, path in files:
        if number != previous + 1:
            raise SystemExit(f"version {previous + 1} is missing in {folder}: not a linear history")
        previous = number
        tensors = read_update(path)
        if kind == "full":
            load_full(model, tensors)
            continue
        old = reference_scores(model)
        parent = {k: v.clone() for k, v in state_dict(model).items()}
        apply_delta(model, {k: v.to(torch.bfloat16).float() for k, v in tensors.items()})
        rounded = reference_scores(model)
        load_full(model, parent)
        apply_delta(model, tensors)  # the version as shipped: parent + fp32 delta
        new = reference_scores(model)
        totals = defaultdict(float)
        for name, value in tensors.items():
            numbers = measure_tensor(value.float())
            for key, x in numbers.items():
                by_role[role(name)][key] += x
                totals[key] += x
            by_role[role(name)]["tensors"] += 1
        totals["tensors"] = len(tensors)
        versions.append(
            {
                "version": number,
                "file_bytes": path.stat().st_size,
                "tensors": len(tensors),
                "totals": dict(totals),
                "separation": new.max_abs_diff(old),  # parent vs version on the probe
                "bf16_probe_diff": new.max_abs_diff(rounded),  # fp32 vs bf16 delta
            }
        )
        print(f"[delta-bytes] v{number}: {summary(versions[-1])}", file=sys.stderr, flush=True)
        if number == measured[-1]:
            if timing is not None:  # the last measured version's payload, timed
                report["timing"] = {"version": number, **time_payload(model, parent, *timing)}
            break
    report["versions"] = versions
    report["by_role"] = {k: dict(v) for k, v in by_role.items()}
    return report


def summary(v: dict) -> str:
    t = v["totals"]
    return (
        f"{t['fp32'] / 1e6:.0f} MB fp32, zero {t['zero'] / t['elements']:.2%}, "
        f"zstd fp32 {t['zstd_fp32'] / t['fp32']:.3f}, zstd bf16 {t['zstd_bf16'] / t['fp32']:.3f}, "
        f"probe: separation {v['separation']:.3g}, bf16 diff {v['bf16_probe_diff']:.3g}"
    )


def table(report: dict) -> str:
    lines = [
        "| tensors | count | elements | exactly zero | all-zero rows | fp32 MB | bf16 MB "
        "| zstd(fp32) / fp32 | zstd(bf16) / fp32 | bf16 rel. error (L2) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    roles = sorted(report["by_role"].items(), key=lambda kv: -kv[1]["fp32"])
    total = defaultdict(float)
    for _name, r in roles:
        for key, value in r.items():
            total[key] += value
    for name, r in [*roles, ("all", total)]:
        rows = f"{r['rows_zero'] / r['rows']:.2%}" if r["rows"] else "-"
        lines.append(
            f"| {name} | {r['tensors']:.0f} | {r['elements']:,.0f} | "
            f"{r['zero'] / r['elements']:.3%} | {rows} | {r['fp32'] / 1e6:.1f} | "
            f"{r['bf16'] / 1e6:.1f} | {r['zstd_fp32'] / r['fp32']:.3f} | "
            f"{r['zstd_bf16'] / r['fp32']:.3f} | {(r['err_sq'] / r['sq']) ** 0.5:.2e} |"
        )
    lines += ["", "| version | tensors | file MB | probe separation | bf16 probe diff |"]
    lines += ["|---|---|---|---|---|"]
    for v in report["versions"]:
        lines.append(
            f"| {v['version']} | {v['tensors']} | {v['file_bytes'] / 1e6:.1f} | "
            f"{v['separation']:.3g} | {v['bf16_probe_diff']:.3g} |"
        )
    timing = report.get("timing")
    if timing:
        lines += ["", f"version {timing['version']}'s payload, median seconds:", ""]
        lines += ["| delta dtype | bytes | delta (+ adopt) | write | checksum | sum |"]
        lines += ["|---|---|---|---|---|---|"]
        for name in ("float32", "bfloat16"):
            t = timing[name]
            total = t["delta"] + t["write"] + t["checksum"]
            lines.append(
                f"| {name} | {t['bytes'] / 1e6:.1f} MB | {t['delta']:.2f} | {t['write']:.2f} | "
                f"{t['checksum']:.2f} | {total:.2f} |"
            )
        z = timing["zstd_bf16_file"]
        lines.append(
            f"\nzstd -{ZSTD_LEVEL} of the bf16 file: {z['bytes'] / 1e6:.1f} MB, "
            f"{z['compress']:.2f} s to compress, {z['decompress']:.2f} s to decompress"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="the base checkpoint's folder")
    parser.add_argument("--versions", type=Path, required=True, help="<home>/versions/<model>")
    parser.add_argument("--max-deltas", type=int, default=6, help="deltas measured (the first)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "delta_bytes.json")
    parser.add_argument(
        "--timing", type=int, default=0, help="time the last delta's payload N times (0: no)"
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp"), help="for --timing's files")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    report = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "base": str(args.base),
        "versions_dir": str(args.versions),
        "parity_tolerance": PARITY_TOLERANCE,
        "zstd_level": ZSTD_LEVEL,
        **measure(
            args.base,
            args.versions,
            args.max_deltas,
            (args.scratch, args.timing) if args.timing else None,
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
