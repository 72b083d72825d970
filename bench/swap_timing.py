"""One verified swap through the weight-update seam, timed step by step, for the weight-sync
benchmarks (full delta, LoRA, HTTP delivery): the coordinator's sequence without its database.

    stage      (a client keeps sending short requests meanwhile: the stall a stage causes)
    pause(wait), apply, reset_prefix_cache, resume          = the pause window
    verify     the probe's served scores, judged by the coordinator's rule
               (`trainer/swap/verification.py`: the backend's noise band, and clearly closer to
               the new reference than to the old)
    commit     or: pause(abort), rollback, reset_prefix_cache, resume, and the old weights'
               served scores checked against the old reference again

`timed_swap` returns the keys of the shared weight-sync row (`ROW_KEYS`) and the verdict; every
benchmark adds its own columns to it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import httpx

from trainer.backends.parity import PROBE_TOKEN_IDS, ProbeScores
from trainer.backends.vllm_control import VllmControl
from trainer.swap.verification import judge
from trainer.weight_update.base import WeightUpdate

SERVED_NAME = "bench"
# The row every weight-sync method reports (full delta, LoRA, HTTP delivery: one table).
ROW_KEYS = (
    "method",
    "dtype",
    "bytes_shipped",
    "stage_s",
    "pause_ms",
    "out_of_service_s",
    "verify_s",
    "slowest_request_during_stage_s",
    "unloaded_latency_s",
)


def probe_request(model: str = SERVED_NAME) -> dict:
    """A 2-token request: what a client's latency is measured with."""
    return {"model": model, "prompt": list(PROBE_TOKEN_IDS[:8]), "max_tokens": 2}


def unloaded_latency(
    http: httpx.Client, url: str, model: str = SERVED_NAME, count: int = 5
) -> float:
    """Median seconds of a 2-token request to the idle backend (one at a time, nothing else)."""
    spans = []
    for _ in range(count):
        t0 = time.perf_counter()
        http.post(f"{url}/v1/completions", json=probe_request(model)).raise_for_status()
        spans.append(time.perf_counter() - t0)
    return statistics.median(spans)


class LatencyProbe:
    """Short requests sent back to back from a thread: what a client of this backend sees while
    a stage runs (the worker stages in a background thread, so the engine keeps serving)."""

    def __init__(self, url: str, model: str = SERVED_NAME) -> None:
        self.url, self.model = url, model
        self.spans: list[tuple[float, float]] = []
        self.walls: list[float] = []  # each request's start, wall clock (the worker's timeline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=900.0) as http:
            while not self._stop.is_set():
                t0, wall = time.perf_counter(), time.time()
                http.post(
                    f"{self.url}/v1/completions", json=probe_request(self.model)
                ).raise_for_status()
                self.spans.append((t0, time.perf_counter()))
                self.walls.append(wall)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        time.sleep(1.0)  # a few requests before, for the usual latency
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=900)

    def during(self, start: float, end: float) -> dict:
        before = [b - a for a, b in self.spans if b < start]
        overlapping = [
            (b - a, wall)
            for (a, b), wall in zip(self.spans, self.walls, strict=True)
            if a < end and b > start
        ]
        slowest = sorted(overlapping, reverse=True)[:3]
        return {
            "usual_latency_s": statistics.median(before) if before else None,
            "max_latency_during_s": slowest[0][0] if slowest else None,
            "requests_during": len(overlapping),
            "slowest_during": [{"latency_s": s, "start_wall": w} for s, w in slowest],
        }


def idle_window(url: str, seconds: float, model: str = SERVED_NAME) -> dict:
    """The control for a stage's stall: the same probe for `seconds` with no stage at all (the
    slowest of as many requests as a stage sees, on this machine as it is)."""
    with LatencyProbe(url, model) as probe:
        start = time.perf_counter()
        time.sleep(seconds)
        end = time.perf_counter()
    return probe.during(start, end)


def overlapping_phases(stall: dict, worker_stage: dict | None) -> list[str]:
    """For each slowest request during a stage: the worker's stage phases it overlapped."""
    timeline = (worker_stage or {}).get("timeline") or []
    out = []
    for slow in stall.get("slowest_during", []):
        a, b = slow["start_wall"], slow["start_wall"] + slow["latency_s"]
        names = sorted({name for name, s, e in timeline if s < b and e > a})
        out.append(f"{slow['latency_s']:.3f}s: {', '.join(names) or 'no phase'}")
    return out


def timed_swap(
    vllm: VllmControl,
    update: WeightUpdate,
    reference: ProbeScores,
    *,
    old_reference: ProbeScores,
    tolerance: float,
    version: int | None = None,
    old_version: int | None = None,
    observe: Callable[[str], None] | None = None,
) -> dict:
    """Stage, pause, apply, reset cache, resume, verify, commit or roll back `update` on the
    backend `vllm` serving `old_version` (judged against `reference`, the new version's, with
    the noise band `tolerance`); seconds for each step. `observe("staged" | "applied")` runs
    right after the stage and after the verification (e.g. to read the server's memory)."""
    steps: dict[str, float] = {}
    before = update.served_name(SERVED_NAME, old_version)  # what clients call meanwhile
    with LatencyProbe(vllm.url, before) as probe:
        t_stage = time.perf_counter()
        staged = update.stage(vllm)
        t_staged = time.perf_counter()
    steps["stage"] = t_staged - t_stage
    stall = probe.during(t_stage, t_staged)
    if observe is not None:
        observe("staged")

    def step(name: str, fn: Callable, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            steps[name] = time.perf_counter() - t

    t_pause = time.perf_counter()
    step("pause", vllm.pause, "wait")
    applied = step("apply", update.apply, vllm)
    step("reset_cache", vllm.reset_prefix_cache)
    step("resume", vllm.resume)
    t_resumed = time.perf_counter()
    served = update.verify(vllm, SERVED_NAME, version)
    verdict = judge(served, reference, old_reference, tolerance=tolerance)
    t_verified = time.perf_counter()
    steps["parity"] = t_verified - t_resumed
    if observe is not None:
        observe("applied")
    restored_diff = None
    if verdict.accepted:
        update.commit(vllm)
    else:  # what the coordinator does: take the old weights back, and check them
        vllm.pause("abort")
        update.rollback(vllm)
        vllm.reset_prefix_cache()
        vllm.resume()
        restored = update.verify(vllm, SERVED_NAME, old_version)
        restored_diff = restored.max_abs_diff(old_reference)
    return {
        "bytes_shipped": staged.nbytes,
        "stage_s": steps["stage"],
        "pause_ms": (t_resumed - t_pause) * 1000,
        "out_of_service_s": t_verified - t_pause,
        "verify_s": steps["parity"],
        "slowest_request_during_stage_s": stall["max_latency_during_s"],
        "slowest_overlapped": overlapping_phases(stall, _first_worker(staged.detail)),
        "usual_latency_s": stall["usual_latency_s"],
        "steps": steps,
        "parity_max_diff": verdict.diff_new,
        "parity_old_diff": verdict.diff_old,
        "tolerance": verdict.tolerance,
        "parity_ok": verdict.accepted,
        "refusal_reason": verdict.reason,
        "restored_parity_diff": restored_diff,
        "greedy_token_matches": served.next_token == reference.next_token,
        "delivery": staged.note,
        "worker_stage": _first_worker(staged.detail),
        "worker_apply": _first_worker(applied),
    }


def _first_worker(report):
    """The first worker's report of a collective_rpc (a list, one per worker), or the report
    itself when the update answered with one object (LoRA: vLLM's own endpoint)."""
    if isinstance(report, list):
        return report[0] if report else None
    return report
