"""CPU time of the benchmark's processes (the load generator, the upstream, the gateway with its
children, and the Postgres backends serving the gateway's database), read from /proc via psutil.

CPU time per request is much less sensitive than latency to other work on a shared machine, so the
report gives it beside the latencies. Without psutil the meter reads nothing.
"""

from __future__ import annotations

import contextlib
import time

try:
    import psutil
except ImportError:  # pragma: no cover - psutil comes with vllm
    psutil = None


def _tree_cpu_s(pid: int) -> float:
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def postgres_backends(dsn: str, database: str) -> list[int]:
    """Process ids of the Postgres backends connected to `database` now."""
    import psycopg

    sql = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(sql, (database,)).fetchall()]


class CpuMeter:
    """`snapshot()`: CPU seconds so far by role: `client` (this process), each named process tree,
    and `postgres` (the listed backend pids, summed)."""

    def __init__(self, trees: dict[str, int], postgres_pids: list[int] | None = None) -> None:
        self.trees = trees
        self.postgres_pids = postgres_pids or []

    @property
    def available(self) -> bool:
        return psutil is not None

    def snapshot(self) -> dict[str, float]:
        if psutil is None:
            return {}
        out = {"client": time.process_time()}
        for role, pid in self.trees.items():
            with contextlib.suppress(psutil.Error):
                out[role] = _tree_cpu_s(pid)
        if self.postgres_pids:
            total = 0.0
            for pid in self.postgres_pids:
                try:
                    t = psutil.Process(pid).cpu_times()
                except psutil.Error:
                    continue
                total += t.user + t.system
            out["postgres"] = total
        return out


def per_request_ms(before: dict[str, float], after: dict[str, float], requests: int) -> dict:
    """CPU milliseconds per request by role, between two snapshots."""
    if not requests:
        return {}
    return {k: (after[k] - before[k]) * 1000.0 / requests for k in after if k in before}
