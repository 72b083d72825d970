"""The floor for a Python relay on this machine: what the cheapest relay costs, recording nothing,
measured as bench/gateway_overhead.py measures rlgw (same fake upstream, load generator, points).

    .venv/bin/python bench/floor_relay.py                      # 64 tokens, conc 1 and 16
    .venv/bin/python bench/floor_relay.py --serve 8100 http://127.0.0.1:9000   # the relay alone

The relay is raw ASGI on uvicorn (uvloop, httptools) with an aiohttp client: it reads the
request, posts it to the upstream, parses a whole reply with orjson (as any gateway that looks at
the answer must) and sends it back; a stream goes through chunk by chunk, untouched. No routing
table, no validation, no auth, no record: what it costs is the server, the client and the event
loop, the part of rlgw's cost that no gateway in Python avoids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream")]


def relay_app(upstream: str):
    session: list[aiohttp.ClientSession] = []

    async def app(scope, receive, send):
        if scope["method"] == "GET":  # the readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if not session:
            session.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000)))
        headers = {"Content-Type": "application/json"}
        url = upstream + scope["path"]
        async with session[0].post(url, data=body, headers=headers) as reply:
            if orjson.loads(body).get("stream"):
                start = {"type": "http.response.start", "status": reply.status}
                await send(start | {"headers": SSE_HEADERS})
                async for data in reply.content.iter_any():
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            payload = orjson.loads(await reply.read())
        start = {"type": "http.response.start", "status": reply.status, "headers": HEADERS}
        await send(start)
        await send({"type": "http.response.body", "body": orjson.dumps(payload)})

    return app


def serve(port: int, upstream: str) -> None:
    import uvicorn

    uvicorn.run(
        relay_app(upstream.rstrip("/")),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


def measure(args: argparse.Namespace) -> None:
    import tempfile

    from bench.cpu_usage import CpuMeter, per_request_ms
    from bench.fake_upstream import start_fake_upstream, stop, upstream_url
    from bench.gateway_overhead import API_PATH, MODEL, body_for
    from bench.loadgen import run_point
    from bench.overhead_report import summarize
    from bench.processes import free_port, log, start_server, stop_group

    work = Path(tempfile.mkdtemp(prefix="floor-relay-"))
    up_port, relay_port = free_port(), free_port()
    upstream = start_fake_upstream(up_port, MODEL, log_path=work / "upstream.log")
    up = upstream_url(up_port)
    cmd = [sys.executable, __file__, "--serve", str(relay_port), up]
    relay = start_server(
        cmd,
        env={"PATH": "/usr/bin:/bin"},
        log_path=work / "relay.log",
        ready_url=f"http://127.0.0.1:{relay_port}/",
        name="floor relay",
        timeout_s=30,
    )
    urls = {"direct": up, "floor": f"http://127.0.0.1:{relay_port}"}
    meters = {
        "direct": CpuMeter({"upstream": upstream.pid}),
        "floor": CpuMeter({"upstream": upstream.pid, "relay": relay.pid}),
    }
    print(
        "| mode | conc | direct p50 ms | floor added p50 ms | added TTFB p50 ms | "
        "floor req/s | floor CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|")
    try:
        for stream in (False, True):
            for conc in args.concurrency:
                rows = {}
                for path in ("direct", "floor"):
                    res = run_point(
                        urls[path] + API_PATH["chat"],
                        body_for("chat", args.tokens, stream),
                        stream=stream,
                        concurrency=conc,
                        requests=args.requests,
                        warmup=max(20, 2 * conc),
                        probe=meters[path].snapshot,
                    )
                    rows[path] = summarize(res.latency_ms, res.ttfb_ms) | {
                        "rps": res.rps,
                        "cpu": per_request_ms(res.cpu_before, res.cpu_after, res.ok).get("relay"),
                    }
                d, f = rows["direct"], rows["floor"]
                ttfb = f"{f['ttfb_p50_ms'] - d['ttfb_p50_ms']:+.2f}" if stream else "-"
                print(
                    f"| {'stream' if stream else 'whole'} | {conc} | {d['p50_ms']:.2f} | "
                    f"{f['p50_ms'] - d['p50_ms']:+.2f} | {ttfb} | {f['rps']:.0f} | "
                    f"{f['cpu']:.2f} |",
                    flush=True,
                )
    finally:
        stop_group(relay)
        stop(upstream)
        log(f"logs in {work}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", nargs=2, metavar=("PORT", "UPSTREAM"), help="run the relay alone")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=400)
    args = p.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
    else:
        measure(args)


if __name__ == "__main__":
    main()
