"""One run of the placement benchmark: a real stack (vLLM with the placement's cores, `rlgw
serve` on a fresh database, `rlgw train` with the placement) driven by the agents for a
wall-clock budget, with the trainer killed once mid-run and restarted; returns what the report
needs (held-out curve, the client ledger, process memory, the database's rows)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

from bench.placement_agents import Agents, Faults, Ledger
from bench.processes import log
from bench.rlgw_process import RLGW, RlgwServer
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.placement import Placement, format_cpus
from rlgw.ports import free_port
from rlgw.registry import register_backend
from trainer.models import demo_task


@dataclass(frozen=True)
class RunSpec:
    placement: Placement
    seed: int
    minutes: float
    model_dir: Path
    home: Path  # this run's state directory (trainer versions, logs)
    pg: str = "postgresql://postgres@127.0.0.1:5432"
    group_size: int = 8
    groups_per_update: int = 4
    agents: int = 4
    concurrency: int = 24
    lr: float = 2e-3
    eval_prompts: int = 64
    eval_samples: int = 2
    eval_every_s: float = 30.0
    kill_at: float = 0.5  # share of the budget at which the trainer is killed (SIGKILL)
    faults: Faults = field(default_factory=Faults)

    @property
    def name(self) -> str:
        return f"{self.placement.kind}-seed{self.seed}"


@dataclass
class RunResult:
    spec: RunSpec
    curve: list[dict] = field(default_factory=list)  # {t, version, reward}
    ledger: Ledger = field(default_factory=Ledger)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    kill_wall: float | None = None
    started_wall: float = 0.0
    ended_wall: float = 0.0
    rows: dict = field(default_factory=dict)  # read from the database before it is dropped
    exports: dict[str, dict] = field(default_factory=dict)  # trajectories of consumed sessions


class MemorySampler(threading.Thread):
    """Peak resident memory of each process group (vLLM, trainer, gateway) and of this one."""

    def __init__(self, groups: dict[str, callable]) -> None:
        super().__init__(daemon=True)
        self.groups, self.peak = groups, {name: 0.0 for name in [*groups, "agents"]}
        self.stop = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(1.0):
            for name, pgid in self.groups.items():
                self.peak[name] = max(self.peak[name], _group_rss_mb(pgid()))
            self.peak["agents"] = max(self.peak["agents"], me.memory_info().rss / 2**20)


def _group_rss_mb(pgid: int | None) -> float:
    if pgid is None:
        return 0.0
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                total += proc.memory_info().rss
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return total / 2**20


class Trainer:
    """`rlgw train` as its own process group (killable), logging to the run's home."""

    def __init__(self, spec: RunSpec, env: dict[str, str], model: str) -> None:
        self.spec, self.env, self.model = spec, env, model
        self.proc: subprocess.Popen | None = None
        self.log_path = spec.home / "trainer.log"

    def start(self) -> None:
        batch = self.spec.groups_per_update * self.spec.group_size
        argv = [str(RLGW), "train", "--model", self.model, "--placement", self.spec.placement.kind]
        for role in ("trainer", "backend"):
            if (cpus := self.spec.placement.cpus(role)) is not None:
                argv += [f"--{role}-cpus", format_cpus(cpus)]
        argv += ["--batch-sessions", str(batch), "--min-sessions", str(batch)]
        argv += ["--lr", str(self.spec.lr), "--seed", str(self.spec.seed)]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def pgid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


def current_version(gw: RlgwServer, model: str) -> int:
    with psycopg.connect(f"{gw.pg}/{gw.db}") as conn:
        row = conn.execute("SELECT current_version FROM models WHERE name = %s", (model,))
        return int(row.fetchone()[0])


async def drive(spec: RunSpec, gw: RlgwServer, trainer: Trainer, model: str, result: RunResult):
    from rlgw_sdk import AsyncGateway

    held_out = demo_task.make_prompts("held-out-eval", spec.eval_prompts, demo_task.HELD_OUT_SPLIT)
    slots = asyncio.Semaphore(spec.concurrency)
    async with AsyncGateway(gw.url, timeout=600) as gateway:
        agents = Agents(
            gateway,
            model,
            seed=spec.seed,
            group_size=spec.group_size,
            faults=spec.faults,
            ledger=result.ledger,
            slots=slots,
        )

        async def evaluate() -> None:
            version = current_version(gw, model)
            reward = await agents.evaluate(held_out, spec.eval_samples)
            t = time.time() - result.started_wall
            result.curve.append({"t": round(t, 1), "version": version, "reward": round(reward, 4)})
            log(f"{spec.name}: t={t:6.1f}s version {version:3d} held-out reward {reward:.3f}")

        result.started_wall = time.time()
        await evaluate()
        stop = asyncio.Event()
        loops = [asyncio.create_task(agents.run(i, stop)) for i in range(spec.agents)]
        deadline = result.started_wall + spec.minutes * 60
        kill_at = result.started_wall + spec.kill_at * spec.minutes * 60
        next_eval = time.time() + spec.eval_every_s
        while time.time() < deadline:
            await asyncio.sleep(0.5)
            if result.kill_wall is None and time.time() >= kill_at:
                result.kill_wall = time.time()
                log(f"{spec.name}: killing the trainer (SIGKILL) and starting it again")
                await asyncio.to_thread(trainer.kill)
                trainer.start()
            if time.time() >= next_eval and time.time() < deadline:
                await evaluate()
                next_eval = time.time() + spec.eval_every_s
        stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
        await evaluate()
        result.ended_wall = time.time()
        for task in list(agents.late_rewards):
            task.cancel()


def run(spec: RunSpec) -> RunResult:
    """One run, start to finish; everything it started is stopped, its database dropped."""
    from bench.placement_rows import read_rows

    spec.home.mkdir(parents=True, exist_ok=True)
    model = f"placement-{spec.name}"
    result = RunResult(spec)
    backend_port = free_port()
    log(f"{spec.name}: {spec.placement.describe()}; vLLM on port {backend_port}")
    backend = start_backend(
        spec.model_dir,
        backend_port,
        served_model_name=model,
        log_path=spec.home / "vllm.log",
        placement=spec.placement,
    )
    trainer: Trainer | None = None
    sampler: MemorySampler | None = None
    try:
        backend_url = f"http://127.0.0.1:{backend_port}"
        wait_healthy(backend_url, proc=backend, timeout_s=600)
        hold = {"RLGW_BACKEND_HOLD_S": "300", "RLGW_GROUP_DEADLINE_S": "120"}
        with RlgwServer(
            free_port(), pg=spec.pg, log_path=spec.home / "gateway.log", extra_env=hold
        ) as gw:
            engine = make_sync_engine(
                f"{gw.pg}/{gw.db}".replace("postgresql://", "postgresql+psycopg://", 1)
            )
            register_backend(
                sync_session_factory(engine), model, backend_url, model_path=str(spec.model_dir)
            )
            engine.dispose()
            env = {**os.environ, **gw.env, "RLGW_HOME": str(spec.home)}
            trainer = Trainer(spec, env, model)
            trainer.start()
            sampler = MemorySampler(
                {
                    "vllm": lambda: backend.pid,
                    "trainer": trainer.pgid,
                    "gateway": lambda: gw.proc.pid,
                }
            )
            sampler.start()
            asyncio.run(drive(spec, gw, trainer, model, result))
            trainer.stop()
            sampler.stop.set()
            result.rows, result.exports = read_rows(gw, model, result.ledger)
    finally:
        if sampler is not None:
            sampler.stop.set()
            result.peak_rss_mb = {k: round(v, 1) for k, v in sampler.peak.items()}
        if trainer is not None:
            trainer.stop()
        stop_backend(backend)
    return result


if __name__ == "__main__":
    sys.exit("run bench/placement.py")
