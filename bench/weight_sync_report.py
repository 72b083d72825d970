"""One table of every weight-sync method measured: the full delta (`bench/weight_sync.py`), LoRA
adapters (`bench/weight_sync_lora.py`) and HTTP delivery (`bench/weight_sync_http.py`), read from
their JSON results, one row per preset, method and dtype, medians over the swaps.

    .venv/bin/python bench/weight_sync_report.py [--results bench/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.swap_timing import ROW_KEYS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# What the HTTP benchmark calls its two methods, in this table (the same delta file either way).
HTTP_METHODS = {"path": "delta-file (path, beside HTTP)", "http": "delta-file over HTTP"}


def swaps(results: Path) -> list[dict]:
    """Every swap (not the refusal cases) of the three benchmarks, as rows with `preset`."""
    rows: list[dict] = []
    full = results / "weight_sync.json"
    if full.is_file():
        for result in json.loads(full.read_text())["results"]:
            for swap in result["swaps"]:
                rows.append(
                    {
                        **swap,
                        "preset": result["preset"],
                        "method": "delta-file",
                        "dtype": result["dtype"],
                        "unloaded_latency_s": result["unloaded_latency_s"],
                    }
                )
    for name, rename in (("weight_sync_lora.json", {}), ("weight_sync_http.json", HTTP_METHODS)):
        path = results / name
        if path.is_file():
            report = json.loads(path.read_text())
            for row in report["rows"]:
                method = rename.get(row["method"], row["method"])
                rows.append({**row, "preset": report["preset"], "method": method})
    return rows


def table(rows: list[dict]) -> str:
    keys = ROW_KEYS[2:]
    lines = [
        "| preset | method | dtype | swaps accepted | "
        + " | ".join(keys)
        + " | stall / unloaded | parity max diff | band |",
        "|" + "---|" * (len(keys) + 7),
    ]
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["preset"], row["method"], row["dtype"]), []).append(row)
    for (preset, method, dtype), group in groups.items():

        def median(key: str, group=group) -> float:
            return statistics.median(r[key] or 0.0 for r in group)

        stall = max(r["slowest_request_during_stage_s"] or 0.0 for r in group)
        cells = [f"{median(k):.4g}" for k in keys]
        cells[keys.index("slowest_request_during_stage_s")] = f"{stall:.4g}"  # the worst
        accepted = sum(bool(r["parity_ok"]) for r in group)
        ratio = stall / median("unloaded_latency_s") if median("unloaded_latency_s") else 0.0
        lines.append(
            f"| {preset} | {method} | {dtype} | {accepted}/{len(group)} | "
            + " | ".join(cells)
            + f" | {ratio:.1f}x | {max(r['parity_max_diff'] for r in group):.1e} "
            f"| {max(r['tolerance'] for r in group):.1e} |"
        )
    lines.append("")
    lines.append(
        "Medians over each row's swaps, except the slowest request during a stage (the worst of "
        "them) and the parity and band columns (the largest)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = swaps(args.results)
    if not rows:
        print(f"no weight-sync results under {args.results}", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
