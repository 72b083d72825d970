"""Where rlgw's CPU goes per recorded request: py-spy on a real `rlgw serve` under one point.

    .venv/bin/python bench/profile_gateway.py --mode whole --concurrency 16 --requests 2000
    .venv/bin/python bench/profile_gateway.py --mode stream --concurrency 16 --out /tmp/stream.txt

The fake upstream (bench/fake_upstream.py), a fresh database and the load generator as in
bench/gateway_overhead.py; after a warm-up, py-spy samples the gateway process (all its threads)
while `--requests` are served. Prints the share of samples by the innermost gateway frame and by
package, and the top functions by own time; the raw collapsed stacks go to `--out`. Samples are
wall-clock samples of running threads: proportions, not absolute times (the CPU milliseconds
per request are bench/gateway_overhead.py's).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fake_upstream import start_fake_upstream, stop, upstream_url  # noqa: E402
from bench.gateway_overhead import body_for  # noqa: E402
from bench.loadgen import run_point  # noqa: E402
from bench.processes import free_port  # noqa: E402
from bench.rlgw_process import RlgwServer  # noqa: E402

_LINE = re.compile(r":\d+\)")


def summarize(path: Path, top: int = 20) -> str:
    """Shares of the collapsed stacks in `path`: by innermost gateway frame, by package, by own
    time."""
    by_gateway: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    by_self: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [_LINE.sub(")", f) for f in stack.split(";")[1:]]  # [0] names the process
        if not frames:
            continue
        total += n
        ours = [f for f in frames if "(gateway/" in f]
        by_gateway[ours[-1] if ours else "(no gateway frame: server, client, event loop)"] += n
        leaf = frames[-1]
        by_self[leaf] += n
        package = leaf.rpartition("(")[2].split("/")[0].rstrip(")")
        by_package[package] += n
    out = [f"{total} samples"]
    for title, counter in (
        ("innermost gateway frame", by_gateway),
        ("package of the running function", by_package),
        ("own time", by_self),
    ):
        out.append(f"\n-- by {title}")
        out += [f"{v / total * 100:5.1f}%  {k[:120]}" for k, v in counter.most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["whole", "stream"], default="whole")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--out", type=Path, default=Path("bench/results/profile_gateway.txt"))
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    stream = args.mode == "stream"
    body = body_for("chat", args.tokens, stream)
    up_port = free_port()
    upstream = start_fake_upstream(up_port, "bench")
    try:
        with RlgwServer(free_port()) as gw:
            gw.register("bench", upstream_url(up_port))
            url = gw.url + "/v1/chat/completions"
            warm = max(100, 4 * args.concurrency)
            run_point(
                url, body, stream=stream, concurrency=args.concurrency, requests=warm, warmup=0
            )
            cmd = [spy, "record", "--pid", str(gw.proc.pid), "--format", "raw", "--nonblocking"]
            sampler = subprocess.Popen([*cmd, "-o", str(args.out), "--rate", str(args.rate)])
            time.sleep(1.0)  # py-spy attached
            result = run_point(
                url,
                body,
                stream=stream,
                concurrency=args.concurrency,
                requests=args.requests,
                warmup=0,
            )
            sampler.send_signal(2)
            sampler.wait(timeout=60)
            point = f"{args.mode} c{args.concurrency}"
            print(f"{point}: {result.ok} ok, {result.errors} errors, {result.rps:.0f} req/s")
    finally:
        stop(upstream)
    print(summarize(args.out))


if __name__ == "__main__":
    main()
