"""The gateway-overhead report: per point, latency added over the direct path, throughput relative
to it and CPU per request, as markdown (with the targets checked) and a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

GATEWAYS = ("rlgw", "litellm")
LABELS = {"direct": "direct", "rlgw": "rlgw", "litellm": "LiteLLM"}
TARGET_ADDED_P50_MS = 2.0  # at concurrency 1
TARGET_THROUGHPUT = 0.8  # x direct, at concurrency 64
_ADDED = ("added_p50_ms", "added_p99_ms")


def summarize(latency_ms: list[float], ttfb_ms: list[float]) -> dict[str, float | None]:
    """p50 / p99 / mean of one point's latencies (and p50 / p99 of its TTFB, streams only)."""

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    return {
        "p50_ms": pct(latency_ms, 50),
        "p99_ms": pct(latency_ms, 99),
        "mean_ms": float(np.mean(latency_ms)) if latency_ms else None,
        "ttfb_p50_ms": pct(ttfb_ms, 50),
        "ttfb_p99_ms": pct(ttfb_ms, 99),
    }


def _key(row: dict[str, Any]) -> tuple:
    return (row["tokens"], row["stream"], row["concurrency"])


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per point: its rows by path and, per gateway, added p50/p99/TTFB and throughput."""
    points: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        point = points.setdefault(_key(row), {"key": _key(row), "rows": {}})
        point["rows"][row["path"]] = row
    out = []
    for key in sorted(points):
        point = points[key]
        direct = point["rows"].get("direct")
        for path in GATEWAYS:
            row = point["rows"].get(path)
            if row is None or direct is None or not row["ok"] or not direct["ok"]:
                continue
            ttfb = None
            if row["ttfb_p50_ms"] is not None and direct["ttfb_p50_ms"] is not None:
                ttfb = row["ttfb_p50_ms"] - direct["ttfb_p50_ms"]
            point[path] = {
                "added_p50_ms": row["p50_ms"] - direct["p50_ms"],
                "added_p99_ms": row["p99_ms"] - direct["p99_ms"],
                "throughput_x": row["rps"] / direct["rps"] if direct["rps"] else None,
                "added_ttfb_p50_ms": ttfb,
            }
        out.append(point)
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}" if abs(v) < 100 else f"{v:+.0f}"


def _abs_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mode(stream: bool) -> str:
    return "stream" if stream else "whole"


def _where(key: tuple) -> str:
    tokens, stream, conc = key
    return f"{tokens} tokens, {_mode(stream)}, conc {conc}"


def table(points: list[dict[str, Any]]) -> list[str]:
    head = "| tokens | mode | conc | direct p50 / p99 ms | direct req/s |"
    rule = "|---|---|---|---|---|"
    for path in GATEWAYS:
        head += f" {LABELS[path]} added p50 / p99 ms | {LABELS[path]} throughput |"
        rule += "---|---|"
    lines = [head, rule]
    for point in points:
        tokens, stream, conc = point["key"]
        direct = point["rows"].get("direct")
        line = f"| {tokens} | {_mode(stream)} | {conc} | "
        if direct:
            line += f"{_abs_ms(direct['p50_ms'])} / {_abs_ms(direct['p99_ms'])} | "
            line += f"{direct['rps']:.0f} |"
        else:
            line += "- | - |"
        for path in GATEWAYS:
            c = point.get(path)
            if c is None:
                line += " - | - |"
                continue
            line += f" {_ms(c['added_p50_ms'])} / {_ms(c['added_p99_ms'])} |"
            line += f" {_x(c['throughput_x'])} |"
        lines.append(line)
    return lines


def ttfb_table(points: list[dict[str, Any]]) -> list[str]:
    streamed = [p for p in points if p["key"][1]]
    if not streamed:
        return []
    lines = [
        "| tokens | conc | direct TTFB p50 ms | rlgw added TTFB p50 | LiteLLM added TTFB p50 |",
        "|---|---|---|---|---|",
    ]
    for point in streamed:
        tokens, _, conc = point["key"]
        direct = point["rows"].get("direct") or {}
        added = [(point.get(path) or {}).get("added_ttfb_p50_ms") for path in GATEWAYS]
        lines.append(
            f"| {tokens} | {conc} | {_abs_ms(direct.get('ttfb_p50_ms'))} | "
            f"{_ms(added[0])} | {_ms(added[1])} |"
        )
    return lines


def cpu_table(points: list[dict[str, Any]]) -> list[str]:
    """CPU milliseconds per request of each process, by path (robust to a busy machine)."""

    def cpu(point: dict, path: str, role: str) -> str:
        value = ((point["rows"].get(path) or {}).get("cpu_ms_per_request") or {}).get(role)
        return "-" if value is None else f"{value:.2f}"

    if not any(r.get("cpu_ms_per_request") for p in points for r in p["rows"].values()):
        return []
    lines = [
        "| tokens | mode | conc | upstream (direct) | rlgw | rlgw's Postgres backends "
        "| LiteLLM | LiteLLM's Postgres backends | client (direct / rlgw / LiteLLM) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in points:
        tokens, stream, conc = point["key"]
        clients = " / ".join(cpu(point, path, "client") for path in ("direct", *GATEWAYS))
        lines.append(
            f"| {tokens} | {_mode(stream)} | {conc} | {cpu(point, 'direct', 'upstream')} | "
            f"{cpu(point, 'rlgw', 'gateway')} | {cpu(point, 'rlgw', 'postgres')} | "
            f"{cpu(point, 'litellm', 'gateway')} | {cpu(point, 'litellm', 'postgres')} | "
            f"{clients} |"
        )
    return lines


def _verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def targets(points: list[dict[str, Any]]) -> list[str]:
    """The three targets of issue #7, point by point; a target without data says so."""
    lines = [f"- rlgw added p50 latency <= {TARGET_ADDED_P50_MS:g} ms at concurrency 1:"]
    c1 = [p for p in points if p["key"][2] == 1 and "rlgw" in p]
    if not c1:
        lines.append("  not measured (needs the direct and rlgw paths at concurrency 1)")
    for p in c1:
        added = p["rlgw"]["added_p50_ms"]
        ok = added <= TARGET_ADDED_P50_MS
        lines.append(f"  - {_where(p['key'])}: {_ms(added)} ms, {_verdict(ok)}")
    lines.append(f"- rlgw throughput >= {TARGET_THROUGHPUT:g}x direct at concurrency 64:")
    c64 = [p for p in points if p["key"][2] == 64 and "rlgw" in p]
    if not c64:
        lines.append("  not measured (needs the direct and rlgw paths at concurrency 64)")
    for p in c64:
        x = p["rlgw"]["throughput_x"] or 0.0
        lines.append(f"  - {_where(p['key'])}: {_x(x)}, {_verdict(x >= TARGET_THROUGHPUT)}")
    lines.append(
        "- rlgw overhead below LiteLLM's at every point (added p50, added p99, throughput):"
    )
    both = [p for p in points if "rlgw" in p and "litellm" in p]
    if not both:
        lines.append("  not measured (needs the direct, rlgw and litellm paths)")
        return lines
    misses = []
    for p in both:
        r, lt = p["rlgw"], p["litellm"]
        checks = {
            "added p50": r["added_p50_ms"] < lt["added_p50_ms"],
            "added p99": r["added_p99_ms"] < lt["added_p99_ms"],
            "throughput": (r["throughput_x"] or 0) > (lt["throughput_x"] or 0),
        }
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            misses.append(f"  - **MISSED** at {_where(p['key'])}: {', '.join(failed)}")
    met = len(both) - len(misses)
    lines.append(f"  {met} of {len(both)} points met on all three: {_verdict(not misses)}")
    return lines + misses


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]], points: list[dict]) -> str:
    m = meta["machine"]
    la0, la1 = meta["load_average_start"], meta["load_average_end"]
    if meta["requests_per_point"]:
        per = (
            f"{meta['requests_per_point']} measured requests (none started after "
            f"{meta['max_point_s']:g} s)"
        )
    else:
        per = f"{meta['duration_per_point_s']:g} s"
    lines = [
        "# Gateway overhead (bench/gateway_overhead.py)",
        "",
        f"{meta['date']}, commit {meta['commit']}. Machine: {m['cpus']} CPUs ({m['cpu']}), "
        f"Python {m['python']}; load average {la0[0]:.2f} at the start, {la1[0]:.2f} at the "
        "end. The load generator, the fake upstream and the gateway under test all share these "
        f"CPUs. {meta['api']} API, {per} per point after a warm-up of {meta['warmup']}; "
        f"{meta['seconds']} s of measuring in all. Fake upstream: "
        f"{meta['upstream_delay_ms']:g} ms delay, {meta['upstream_token_ms']:g} ms per token.",
        "",
        "Added latency: the gateway's p50 (p99) minus the direct path's p50 (p99) at the same "
        "point; latency is the full response (whole) or the last byte (stream). Throughput: "
        "completed requests per second relative to the direct path.",
    ]
    if meta.get("rlgw_env"):
        env = ", ".join(f"{k}={v}" for k, v in meta["rlgw_env"].items())
        lines.append(
            f"rlgw: `rlgw serve` ({meta['rlgw_workers']} worker(s)) on a fresh database, full "
            f"recording, {env}; stored: {meta.get('rlgw_records')}."
        )
    if meta.get("litellm_version"):
        logging = (
            f"every call logged to Postgres by bench/litellm_pg_logger.py (a success callback; "
            f"{meta.get('litellm_logged_rows')} rows)"
            if meta.get("litellm_log") == "postgres"
            else "no database, no callbacks"
        )
        lines.append(
            f"LiteLLM: proxy {meta['litellm_version']}, one worker, {logging}, access log off."
        )
    lines += ["", *table(points), ""]
    ttfb = ttfb_table(points)
    if ttfb:
        lines += ["Streams, time to first byte:", "", *ttfb, ""]
    cpu = cpu_table(points)
    if cpu:
        lines += ["CPU milliseconds per request, by process:", "", *cpu, ""]
    wanted = meta["requests_per_point"]
    short = [r for r in rows if wanted and r["ok"] + r["errors"] < wanted]
    if short:
        cut = ", ".join(f"{r['path']} at {_where(_key(r))}: {r['ok'] + r['errors']}" for r in short)
        lines += [f"Runs cut short by the time limit (requests measured): {cut}.", ""]
    for r in rows:
        if r["errors"]:
            lines.append(
                f"- errors: {r['path']} at {_where(_key(r))}: {r['errors']} "
                f"(first: {r['first_error']})"
            )
    lines += ["", "## Targets", "", *targets(points), ""]
    return "\n".join(lines)


def plot(points: list[dict[str, Any]], out: Path, title: str) -> None:
    """Added p50/p99 latency and throughput vs concurrency, one column per (tokens, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({p["key"][:2] for p in points})
    if not groups:
        return
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 7.5), squeeze=False)
    colors = {"rlgw": "tab:blue", "litellm": "tab:orange"}
    for col, (tokens, stream) in enumerate(groups):
        mine = [p for p in points if p["key"][:2] == (tokens, stream)]
        mine.sort(key=lambda p: p["key"][2])
        lat, thr = axes[0][col], axes[1][col]
        for path in GATEWAYS:
            have = [p for p in mine if path in p]
            if not have:
                continue
            conc = [p["key"][2] for p in have]
            style = {"color": colors[path]}
            p50 = [p[path]["added_p50_ms"] for p in have]
            p99 = [p[path]["added_p99_ms"] for p in have]
            lat.plot(conc, p50, "o-", label=f"{LABELS[path]} p50", **style)
            lat.plot(conc, p99, "s--", alpha=0.6, label=f"{LABELS[path]} p99", **style)
            thr.plot(
                conc, [p[path]["throughput_x"] for p in have], "o-", label=LABELS[path], **style
            )
        lat.set_title(f"{tokens} tokens, {_mode(stream)}")
        lat.set_yscale("symlog", linthresh=1.0)
        lowest = min((p[g][k] for p in mine for g in GATEWAYS if g in p for k in _ADDED), default=0)
        lat.set_ylim(bottom=min(0.0, lowest * 1.5))
        lat.axhline(TARGET_ADDED_P50_MS, color="grey", lw=0.8, ls=":")
        lat.set_ylabel("added latency vs direct (ms)")
        thr.axhline(TARGET_THROUGHPUT, color="grey", lw=0.8, ls=":")
        thr.axhline(1.0, color="black", lw=0.5)
        thr.set_yscale("log")
        thr.set_ylabel("throughput / direct (log)")
        thr.set_xlabel("concurrency")
        for ax in (lat, thr):
            ax.set_xscale("log", base=2)
            ax.set_xticks([p["key"][2] for p in mine], [str(p["key"][2]) for p in mine])
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
