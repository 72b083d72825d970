"""Gateway overhead: a fast fake vLLM reached directly, through rlgw and through LiteLLM.

One run: rlgw with full recording, the LiteLLM proxy, and the upstream itself.

    .venv/bin/python bench/gateway_overhead.py                  # full matrix (see --help)
    .venv/bin/python bench/gateway_overhead.py --quick          # a short check
    .venv/bin/python bench/gateway_overhead.py --paths direct,rlgw --concurrency 1 --tokens 64

Paths: `direct` (the fake upstream, bench/fake_upstream.py), `rlgw` (a real `rlgw serve` on a
fresh migrated database with the upstream registered as the model's backend; every completion is
recorded; rate and concurrency limits off) and `litellm` (the LiteLLM proxy in
bench/.litellm-venv, installed on first use, an `openai/<model>` entry pointing at the upstream).
Points: concurrency x whole/streamed x answer length; every path gets the same requests from the
same load generator (bench/loadgen.py), which runs in this process, apart from the servers.
Latency is the full response time (whole) or the time to the last byte (stream); TTFB is recorded
for streams. Added latency is the gateway's percentile minus the direct path's at the same point.

On the project's 2-core machine the load generator, the upstream and the gateway under test share
both cores (said in the report). The full matrix takes about 15-20 minutes, most of it LiteLLM's
streamed points; `--quick` about 2.

Writes bench/results/gateway_overhead/: results.json (every figure and the settings),
report.md (the tables and the targets), overhead.png, and logs/ (the servers' logs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import overhead_report as report  # noqa: E402
from bench.cpu_usage import CpuMeter, per_request_ms, postgres_backends  # noqa: E402
from bench.fake_upstream import start_fake_upstream, stop, upstream_url  # noqa: E402
from bench.litellm_proxy import (  # noqa: E402
    LITELLM_VERSION,
    LiteLLMProxy,
    RequestLogDatabase,
    ensure_litellm,
)
from bench.loadgen import run_point  # noqa: E402
from bench.processes import free_port, log  # noqa: E402
from bench.rlgw_process import BENCH_ENV, RlgwServer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "gateway_overhead"
MODEL = "bench"
PATHS = ("direct", "rlgw", "litellm")
API_PATH = {"chat": "/v1/chat/completions", "text": "/v1/completions"}


def csv(kind):
    return lambda text: [kind(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paths", type=csv(str), default=list(PATHS), help="direct,rlgw,litellm")
    p.add_argument("--concurrency", type=csv(int), default=[1, 16, 64])
    p.add_argument("--modes", type=csv(str), default=["whole", "stream"], help="whole,stream")
    p.add_argument("--tokens", type=csv(int), default=[64, 512], help="answer lengths")
    p.add_argument("--requests", type=int, default=None, help="measured requests per point (400)")
    p.add_argument(
        "--max-point-s", type=float, default=60.0, help="no new request after this (per path)"
    )
    p.add_argument("--duration", type=float, default=None, help="run each point this long")
    p.add_argument("--warmup", type=int, default=None, help="default: max(20, 2 x concurrency)")
    p.add_argument("--quick", action="store_true", help="concurrency 1,16, 64 tokens, 100 req")
    p.add_argument("--api", choices=sorted(API_PATH), default="chat")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432", help="Postgres server")
    p.add_argument("--rlgw-workers", type=int, default=1, help="rlgw serve --workers")
    p.add_argument("--litellm-version", default=LITELLM_VERSION)
    p.add_argument(
        "--litellm-log",
        choices=["none", "postgres"],
        default="none",
        help="postgres: LiteLLM logs every call to Postgres (bench/litellm_pg_logger.py)",
    )
    p.add_argument("--upstream-delay-ms", type=float, default=0.0, help="fake upstream delay")
    p.add_argument("--upstream-token-ms", type=float, default=0.0, help="... per output token")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency = [c for c in args.concurrency if c <= 16] or [1]
        args.tokens = [min(args.tokens)]
        args.requests = args.requests or 100
    args.requests = args.requests or 400
    if args.duration:  # as many requests as fit in that time
        args.requests, args.max_point_s = 1 << 62, args.duration
    unknown = set(args.paths) - set(PATHS) or set(args.modes) - {"whole", "stream"}
    if unknown:
        p.error(f"unknown value(s): {', '.join(sorted(unknown))}")
    # The direct path is the baseline of every figure: always measured, first.
    args.paths = [path for path in PATHS if path in args.paths or path == "direct"]
    return args


def body_for(api: str, tokens: int, stream: bool) -> bytes:
    body: dict = {"model": MODEL, "max_tokens": tokens, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "Tell me a story about a cat on a mat."}]
    else:
        body["prompt"] = "Once upon a time, a cat sat on a mat and"
    return json.dumps(body).encode()


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet"], cwd=REPO).returncode != 0
        return head.strip() + ("+dirty" if dirty else "")
    return "unknown"


def check_recording(gw: RlgwServer, api: str) -> list[str]:
    """One whole and one streamed completion through rlgw, read back: complete, eligible, every
    token and log-prob stored. Returns the problems found (none expected)."""
    problems = []
    for stream in (False, True):
        reply = httpx.post(
            gw.url + API_PATH[api],
            content=body_for(api, 8, stream),
            timeout=30.0,
            headers={"Content-Type": "application/json"},
            trust_env=False,
        )
        what = "streamed" if stream else "whole"
        if reply.status_code != 200 or "X-Completion-Id" not in reply.headers:
            problems.append(f"{what}: HTTP {reply.status_code} {reply.text[:300]}")
            continue
        rec = gw.record(reply.headers["X-Completion-Id"])
        ok = (
            rec["status"] == "complete"
            and rec["eligible"]
            and len(rec["output_token_ids"]) == 8
            and len(rec["output_logprobs"]) == 8
            and bool(rec["prompt_token_ids"])
        )
        log(
            f"rlgw record check ({what}): status={rec['status']} eligible={rec['eligible']} "
            f"tokens={len(rec['output_token_ids'])} logprobs={len(rec['output_logprobs'])} "
            f"finish={rec['finish_reason']} -> {'ok' if ok else 'PROBLEM'}"
        )
        if not ok:
            problems.append(f"{what}: {rec.get('status_reason') or rec.get('eligibility_reason')}")
    return problems


def start_paths(stack: contextlib.ExitStack, args: argparse.Namespace, work: Path) -> tuple:
    """Start the fake upstream and the gateways asked for (stopped when `stack` closes); return
    (base URL by path, CPU meter by path, the RlgwServer or None)."""
    up_port = free_port()
    upstream = start_fake_upstream(
        up_port,
        MODEL,
        log_path=work / "upstream.log",
        delay_ms=args.upstream_delay_ms,
        token_ms=args.upstream_token_ms,
    )
    stack.callback(stop, upstream)
    up = upstream_url(up_port)
    urls = {"direct": up}
    meters = {"direct": CpuMeter({"upstream": upstream.pid})}
    delay = f"delay {args.upstream_delay_ms:g} ms + {args.upstream_token_ms:g} ms/token"
    log(f"fake upstream on {up} (model {MODEL!r}, {delay})")
    gw = None
    if "rlgw" in args.paths:
        gw = RlgwServer(
            free_port(), pg=args.pg, workers=args.rlgw_workers, log_path=work / "rlgw.log"
        )
        stack.enter_context(gw)
        gw.register(MODEL, up)
        urls["rlgw"] = gw.url
        settings = " ".join(f"{k}={v}" for k, v in BENCH_ENV.items())
        log(f"rlgw serve on {gw.url}, db {gw.db}, {args.rlgw_workers} worker(s), {settings}")
        problems = check_recording(gw, args.api)
        if problems:
            raise SystemExit(f"rlgw does not record the fake upstream's completions: {problems}")
        backends = postgres_backends(f"{args.pg}/postgres", gw.db)
        meters["rlgw"] = CpuMeter({"upstream": upstream.pid, "gateway": gw.proc.pid}, backends)
    log_db = None
    if "litellm" in args.paths:
        ensure_litellm(args.litellm_version, log)
        if args.litellm_log == "postgres":
            log_db = stack.enter_context(RequestLogDatabase(args.pg))
            log(f"LiteLLM logs every call to database {log_db.db}")
        log("starting the LiteLLM proxy (about 30 s)")
        dsn = log_db.dsn if log_db is not None else None
        proxy = stack.enter_context(LiteLLMProxy(free_port(), MODEL, up, work, pg_log_dsn=dsn))
        urls["litellm"] = proxy.url
        backends = None
        if log_db is not None:
            backends = litellm_log_backends(proxy.url, log_db, args)
        meters["litellm"] = CpuMeter(
            {"upstream": upstream.pid, "gateway": proxy.proc.pid}, backends
        )
        log(f"LiteLLM {args.litellm_version} proxy on {proxy.url}")
    return urls, meters, gw, log_db


def litellm_log_backends(url: str, log_db: RequestLogDatabase, args: argparse.Namespace) -> list:
    """One call through LiteLLM, once logged: the Postgres backends of its request log (its CPU
    is counted with LiteLLM's, as rlgw's Postgres backends are with rlgw's)."""
    with httpx.Client(timeout=30) as http:
        reply = http.post(
            url + API_PATH[args.api],
            content=body_for(args.api, 8, False),
            headers={"content-type": "application/json"},
        )
        reply.raise_for_status()
    deadline = time.monotonic() + 30
    while log_db.rows() < 1:
        if time.monotonic() > deadline:
            raise SystemExit("LiteLLM did not log a call to Postgres within 30 s")
        time.sleep(0.2)
    return postgres_backends(f"{args.pg}/postgres", log_db.db)


def measure(args: argparse.Namespace, points: list[tuple], urls: dict, meters: dict) -> list:
    """Every point on every path, in turn (direct first); one row per (point, path)."""
    rows = []
    for i, (tokens, stream, conc) in enumerate(points, 1):
        mode = "stream" if stream else "whole"
        warmup = args.warmup if args.warmup is not None else max(20, 2 * conc)
        log(f"point {i}/{len(points)}: {tokens} tokens, {mode}, concurrency {conc}")
        direct = None
        for path in args.paths:
            res = run_point(
                urls[path] + API_PATH[args.api],
                body_for(args.api, tokens, stream),
                stream=stream,
                concurrency=conc,
                requests=args.requests,
                warmup=warmup,
                max_s=args.max_point_s,
                probe=meters[path].snapshot,
            )
            row = {"path": path, "tokens": tokens, "stream": stream, "concurrency": conc}
            row |= {"ok": res.ok, "errors": res.errors, "wall_s": res.wall_s, "rps": res.rps}
            row |= report.summarize(res.latency_ms, res.ttfb_ms)
            row["first_error"] = res.first_error
            row["cpu_ms_per_request"] = per_request_ms(
                res.cpu_before, res.cpu_after, res.ok + res.errors
            )
            rows.append(row)
            direct = direct or (row if path == "direct" else None)
            log("  " + progress_line(row, direct))
    return rows


def run(args: argparse.Namespace) -> int:
    info = machine()
    load0 = os.getloadavg()
    log(
        f"gateway overhead bench: {info['cpus']} CPUs ({info['cpu']}), load average "
        f"{load0[0]:.2f}; the load generator, the fake upstream and each gateway share these CPUs"
    )
    points = [
        (tokens, mode == "stream", conc)
        for tokens in args.tokens
        for mode in args.modes
        for conc in args.concurrency
    ]
    if args.duration:
        per = f"{args.duration:g} s"
    else:
        per = f"{args.requests} requests (no new one after {args.max_point_s:g} s)"
    log(f"{len(points)} points x {len(args.paths)} paths ({', '.join(args.paths)}), {per} each")
    work = args.out / "logs"  # the servers' logs and LiteLLM's generated config
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        urls, meters, gw, log_db = start_paths(stack, args, work)
        t_start = time.monotonic()
        rows = measure(args, points, urls, meters)
        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": git_commit(),
            "machine": info,
            "load_average_start": load0,
            "load_average_end": os.getloadavg(),
            "seconds": round(time.monotonic() - t_start, 1),
            "api": args.api,
            "requests_per_point": None if args.duration else args.requests,
            "duration_per_point_s": args.duration,
            "max_point_s": args.max_point_s,
            "warmup": args.warmup if args.warmup is not None else "max(20, 2 x concurrency)",
            "rlgw_env": BENCH_ENV if gw else None,
            "rlgw_workers": args.rlgw_workers if gw else None,
            "litellm_version": args.litellm_version if "litellm" in args.paths else None,
            "upstream_delay_ms": args.upstream_delay_ms,
            "upstream_token_ms": args.upstream_token_ms,
        }
        if gw is not None:
            meta["rlgw_records"] = gw.record_counts()
            log(f"rlgw stored completions: {meta['rlgw_records']}")
        if log_db is not None:
            meta["litellm_log"] = "postgres"
            meta["litellm_logged_rows"] = settled_rows(log_db)
            served = sum(r["ok"] for r in rows if r["path"] == "litellm")
            log(f"LiteLLM logged {meta['litellm_logged_rows']} calls (measured ok: {served})")
    write_outputs(args.out, meta, rows)
    return 0


def settled_rows(log_db: RequestLogDatabase, quiet_s: float = 3.0) -> int:
    """The calls LiteLLM logged, once the count stopped growing for `quiet_s` (its callbacks run
    after the answers)."""
    rows, since = log_db.rows(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.5)
        now = log_db.rows()
        if now != rows:
            rows, since = now, time.monotonic()
    return rows


def progress_line(row: dict, direct: dict | None) -> str:
    def f(v):
        return "-" if v is None else f"{v:.2f}"

    line = (
        f"{row['path']:8s} p50 {f(row['p50_ms'])} ms  p99 {f(row['p99_ms'])} ms  "
        f"{row['rps']:.0f} req/s"
    )
    if row["ttfb_p50_ms"] is not None:
        line += f"  ttfb p50 {f(row['ttfb_p50_ms'])} ms"
    if direct is not None and row is not direct and row["ok"] and direct["ok"]:
        line += (
            f"  | added p50 {row['p50_ms'] - direct['p50_ms']:+.2f} ms, "
            f"p99 {row['p99_ms'] - direct['p99_ms']:+.2f} ms, "
            f"throughput {row['rps'] / direct['rps']:.2f}x"
        )
    cpu = row.get("cpu_ms_per_request") or {}
    if "gateway" in cpu:
        line += f"  | gateway CPU {cpu['gateway']:.2f} ms/req"
    if row["errors"]:
        line += f"  [{row['errors']} errors; first: {row['first_error']}]"
    return line


def write_outputs(out: Path, meta: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    points = report.compare(rows)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = report.markdown(meta, rows, points)
    (out / "report.md").write_text(text)
    m = meta["machine"]
    title = f"Gateway overhead vs direct ({m['cpus']} CPUs shared, {meta['date']})"
    report.plot(points, out / "overhead.png", title)
    print(text, flush=True)
    log(f"wrote {out / 'report.md'}, {out / 'results.json'}, {out / 'overhead.png'}")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(parse_args(argv)))


if __name__ == "__main__":
    main()
