"""`rlgw demo`: agents learn a task online through the gateway, and the reward curve shows it.

Everything is real: an embedded (or configured) Postgres, a vLLM CPU backend serving the model,
the gateway in this process, agent workers that use the official `openai` client on their
session base URL at temperature 1 and post rewards over REST, and the online trainer (its default
configuration, or the trainer options given) pushing verified swaps.

The model: the real default (SmolLM2-135M-Instruct) on small-number addition
(trainer/models/arithmetic_task.py: greedy answers mostly right, samples at temperature 1 mostly
wrong), or `--preset tiny`: a random 90k-parameter model warm-started to copy four letters
(trainer/models/demo_task.py), as before.

--placement shared (default): agents keep generating while the trainer trains and swaps
--placement separated: the same, with vLLM and the trainer on disjoint cores
--placement colocated (or --sync): generation stops while the trainer trains (time-shared)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from migrations.runner import upgrade
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.placement import Placement
from rlgw.ports import free_port
from rlgw.registry import register_backend
from rlgw.settings import Settings
from trainer.config import TrainerConfig

from .database import resolve_database_url
from .models import DEFAULT_MODEL
from .output import CommandError, info
from .placement import add_placement_flags, placement_from
from .serve import GatewayThread
from .trainer_flags import add_trainer_flags, trainer_overrides

TINY_PRESET = "tiny"  # the warm-started copy task: its own learning rate and batch
TINY_TRAINER = {"lr": 2e-3, "batch_sessions": 32, "min_sessions": 32}


@dataclass
class DemoOptions:
    seed: int = 0
    minutes: float = 10.0
    placement: Placement = field(default_factory=Placement)
    preset: str = DEFAULT_MODEL  # or TINY_PRESET
    group_size: int = 8  # samples per training prompt (one session each, one GRPO group)
    agents: int = 4  # concurrent agent workers (each plays one group at a time)
    eval_prompts: int = 25  # the real task's held-out split has 25 pairs
    eval_samples: int = 4  # samples per held-out prompt at each evaluation
    eval_every_s: float = 120.0
    # The first and the last evaluation (before and after training) with more samples per
    # held-out prompt than those in between (None: eval_samples): the benchmark's big ones.
    edge_eval_samples: int | None = None
    # False: the budget counts from the start, the first evaluation included (rlgw demo);
    # True: it starts once the first evaluation is done (minutes of training, the benchmark).
    clock_after_baseline: bool = False
    drain_s: float = 120.0  # at the end, how long an update in flight is waited for
    concurrency: int = 24  # sessions in flight at once (agents and evaluation together)
    trainer: dict = field(default_factory=dict)  # TrainerConfig fields given (flags, file)
    out_dir: Path = Path("demo-results")
    backend_port: int | None = None
    gateway_port: int | None = None


@dataclass
class Curve:
    points: list[dict] = field(default_factory=list)  # {t, version, reward, samples}

    def add(self, t: float, version: int, reward: float, samples: int = 0) -> None:
        self.points.append(
            {"t": round(t, 2), "version": version, "reward": round(reward, 4), "samples": samples}
        )
        info(f"[demo] t={t:6.1f}s  version {version:3d}  held-out reward {reward:.3f}")


class DemoRun:
    """One demo run: its backend, gateway, trainer, agents and evaluator."""

    def __init__(self, settings: Settings, options: DemoOptions) -> None:
        from trainer.models import arithmetic_task, demo_task

        tiny = options.preset == TINY_PRESET
        self.settings, self.options = settings, options
        self.task = demo_task if tiny else arithmetic_task
        mode = options.placement.kind
        self.model_name = f"demo-s{options.seed}-{mode}-{uuid.uuid4().hex[:6]}"
        self.curve = Curve()
        self.stop = threading.Event()
        self.t0 = 0.0
        self.generated = 0  # training groups fully played
        self.updates: list[dict] = []  # the trainer's metrics, one per version
        self.training_s = 0.0  # wall-clock seconds from the start of the budget to the last update
        self.model_path: Path | None = None  # the served checkpoint (version 0), once known

    # ------------------------------------------------------------------ setup
    def model_dir(self) -> Path:
        """The real default model (a link to the shared cache), or the tiny preset's
        warm-started policy for this seed (created once, then reused)."""
        from trainer.models.warm_start import init_demo_model

        if self.options.preset != TINY_PRESET:
            from trainer.models.pretrained import PRETRAINED, install_pretrained

            link = self.settings.home / "models" / self.options.preset
            return install_pretrained(link, PRETRAINED[self.options.preset], log=info)
        path = self.settings.home / "models" / f"demo-seed{self.options.seed}"
        if not (path / "rlgw_model.json").exists() or not (path / "config.json").exists():
            info(f"[demo] warm-starting the policy for seed {self.options.seed}")
            init_demo_model(path, seed=self.options.seed, overwrite=True)
        return path

    def training_prompts(self, worker: int) -> Iterator:
        """Endless training-split prompts for one agent worker."""
        prompts = self.task.make_prompts(
            f"demo-{self.options.seed}-{worker}", 4096, self.task.TRAIN_SPLIT
        )
        return itertools.cycle(prompts)

    def held_out_prompts(self) -> list:
        """The same held-out prompts at every evaluation (never trained on: a disjoint split)."""
        return self.task.make_prompts(
            "held-out-eval", self.options.eval_prompts, self.task.HELD_OUT_SPLIT
        )

    def gateway_settings(self) -> Settings:
        return self.settings.model_copy(
            update={"auth": "off", "rate_limit_rps": 0.0, "max_concurrency_per_key": 0}
        )

    # ------------------------------------------------------------------ agents
    async def play(self, gw, prompt, size: int, *, train: bool) -> list[float]:
        """`size` sessions of one completion each on one prompt, through the SDK (REST) and the
        official openai client bound to each session's base URL.

        Training prompts form one group (GRPO-style, normalized together); held-out evaluation
        sessions are recorded with `train=False`, so they are never trained on.
        """
        group = (
            {"group_id": f"g-{uuid.uuid4().hex}", "group_size": size, "normalization": "mean_std"}
            if train
            else {}
        )

        async def one() -> float:
            async with self.slots:
                session = await gw.create_session(
                    id=f"s-{uuid.uuid4().hex}", train=train, task_id=prompt.prompt_id, **group
                )
                client = session.openai(max_retries=2)
                reply = await client.chat.completions.create(
                    model=self.model_name,
                    messages=prompt.messages,
                    max_tokens=self.task.MAX_NEW_TOKENS,
                    temperature=1.0,
                )
                await client.close()
                value = self.task.reward(prompt, reply.choices[0].message.content or "")
                await session.reward(value, idempotency_key=f"{session.id}:final")
                await session.close()
                return value

        return list(await asyncio.gather(*(one() for _ in range(size))))

    async def agent_loop(self, gw, worker: int) -> None:
        prompts = self.training_prompts(worker)
        while not self.stop.is_set():
            await self.play(gw, next(prompts), self.options.group_size, train=True)
            self.generated += 1

    async def evaluate(self, gw, samples: int | None = None, at: float | None = None) -> float:
        """Held-out success at temperature 1: `samples` (default: eval_samples) completions of
        each held-out prompt, recorded as one point of the curve at `at` seconds (default: now,
        from the start of the budget)."""
        version = self.trainer.version  # the latest committed version (swaps follow within ~1 s)
        prompts = self.held_out_prompts()
        per_prompt = samples or self.options.eval_samples
        rewards = await asyncio.gather(
            *(self.play(gw, p, per_prompt, train=False) for p in prompts)
        )
        count = sum(len(r) for r in rewards)
        mean = sum(sum(r) for r in rewards) / count
        self.curve.add(time.monotonic() - self.t0 if at is None else at, version, mean, count)
        return mean

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        from gateway.main import create_app
        from trainer.loop.service import OnlineTrainer

        o = self.options
        url = resolve_database_url(self.settings)
        self.settings = self.settings.model_copy(update={"database_url": url})
        upgrade(url)
        model_dir = self.model_path = self.model_dir()
        given = {**(TINY_TRAINER if o.preset == TINY_PRESET else {}), **o.trainer}
        config = TrainerConfig(**{"seed": o.seed, **given})
        port = o.backend_port or free_port()
        log = self.settings.home / "logs" / f"{self.model_name}.log"
        info(f"[demo] {self.model_name}: starting vLLM (log: {log})")
        backend = start_backend(
            model_dir,
            port,
            served_model_name=self.model_name,
            log_path=log,
            placement=o.placement,
            lora_rank=config.lora_rank or None,  # LoRA: the backend serves run-time adapters
        )
        engine = make_sync_engine(url)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc=backend, timeout_s=600)
            register_backend(
                sync_session_factory(engine),
                self.model_name,
                f"http://127.0.0.1:{port}",
                model_path=str(model_dir),
            )
            info(f"[demo] trainer config: {config.describe()}")
            app = create_app(self.gateway_settings())
            with GatewayThread(app, o.gateway_port or free_port()) as gateway:
                trainer = OnlineTrainer(
                    self.settings, engine, self.model_name, config, placement=o.placement
                )
                self.trainer = trainer
                try:
                    asyncio.run(self.drive(gateway.url, trainer))
                finally:
                    trainer.close()
        finally:
            stop_backend(backend)
            engine.dispose()
        return self.report()

    async def drive(self, url: str, trainer) -> None:
        o = self.options
        from rlgw_sdk import AsyncGateway

        self.slots = asyncio.Semaphore(self.options.concurrency)
        async with AsyncGateway(url, timeout=300) as gw:
            self.t0 = time.monotonic()
            # the budget is training time when the clock starts after this: the point is at t = 0
            await self.evaluate(gw, o.edge_eval_samples, at=0.0 if o.clock_after_baseline else None)
            if o.clock_after_baseline:
                self.t0 = time.monotonic()
            deadline = self.t0 + o.minutes * 60
            agents = [asyncio.create_task(self.agent_loop(gw, i)) for i in range(o.agents)]
            next_eval = time.monotonic() + o.eval_every_s
            # One loop in every placement: a colocated trainer pauses generation itself (at the
            # gateway) while it updates; the agents' requests wait there meanwhile.
            training = threading.Thread(
                target=self._train_until_stopped, args=(trainer,), daemon=True
            )
            training.start()
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                if time.monotonic() >= next_eval and time.monotonic() < deadline:
                    await self.evaluate(gw)
                    next_eval = time.monotonic() + o.eval_every_s
            self.stop.set()
            for task in agents:
                task.cancel()
            await asyncio.gather(*agents, return_exceptions=True)
            training.join(timeout=o.drain_s)
            if training.is_alive():  # an update still in flight: the budget ends here anyway
                self.training_s = time.monotonic() - self.t0
            await self.evaluate(gw, o.edge_eval_samples)

    def _train_until_stopped(self, trainer) -> None:
        while not self.stop.is_set():
            if self._train_once(trainer.advance) is None and trainer.inflight is None:
                time.sleep(0.2)
        self._train_once(trainer.finish)  # the version still in flight, if any
        self.training_s = time.monotonic() - self.t0

    def _train_once(self, advance):
        """One call of the trainer's `advance` (an update, its version published in the
        background) or `finish`; a version it finished is kept for the throughput figures."""
        report = advance()
        if report is not None and report.version is not None:
            self.updates.append(report.metrics)
        return report

    # ------------------------------------------------------------------ results
    def trainer_throughput(self) -> dict:
        """Output tokens trained on per second: of the optimizer's work alone (`train_s`), and of
        whole update steps (train, write the delta, swap every backend: `step_s`)."""
        tokens = sum(m.get("tokens", 0) for m in self.updates)
        train_s = sum(m.get("train_s", 0) for m in self.updates)
        step_s = sum(m.get("step_s", 0) for m in self.updates)
        return {
            "trainer_tokens": int(tokens),
            "trainer_tokens_per_s": round(tokens / train_s, 1) if train_s else 0.0,
            "trainer_step_tokens_per_s": round(tokens / step_s, 1) if step_s else 0.0,
            "training_wall_s": round(self.training_s, 1),  # the budget, and the update drained
        }

    def report(self) -> dict:
        o = self.options
        points = self.curve.points
        start, final = points[0]["reward"], points[-1]["reward"]
        summary = {
            "model": self.model_name,
            "mode": o.placement.kind,
            "seed": o.seed,
            "minutes": o.minutes,
            "start_reward": start,
            "final_reward": final,
            "best_reward": max(p["reward"] for p in points),
            "gain": round(final - start, 4),
            "versions": points[-1]["version"],
            "groups_generated": self.generated,
            **self.trainer_throughput(),
            "curve": points,
            "options": {k: _plain(v) for k, v in vars(o).items()},
        }
        o.out_dir.mkdir(parents=True, exist_ok=True)
        stem = o.out_dir / f"demo-{summary['mode']}-seed{o.seed}"
        stem.with_suffix(".json").write_text(json.dumps(summary, indent=2))
        plot_curves([summary], stem.with_suffix(".png"))
        print("\n| version | minutes | held-out reward |\n|---|---|---|")
        for p in points:
            print(f"| {p['version']} | {p['t'] / 60:.1f} | {p['reward']:.3f} |")
        print(
            f"\n[demo] {summary['mode']} seed {o.seed}: held-out reward {start:.3f} -> "
            f"{final:.3f} ({summary['gain']:+.3f}) in {o.minutes:g} min, "
            f"{summary['versions']} versions; curve: {stem.with_suffix('.png')}",
            flush=True,
        )
        return summary


def _plain(value):
    """An option as JSON has it: a path as text, a placement as its description."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Placement):
        return value.describe()
    return value


def plot_curves(summaries: list[dict], path: Path) -> None:
    """Held-out reward against wall-clock minutes, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in summaries:
        xs = [p["t"] / 60 for p in s["curve"]]
        ys = [p["reward"] for p in s["curve"]]
        ax.plot(
            xs,
            ys,
            marker="o",
            markersize=3,
            linestyle="--" if s["mode"] == "colocated" else "-",
            label=f"{s['mode']} seed {s['seed']}",
        )
    ax.set_xlabel("wall-clock minutes")
    ax.set_ylabel("held-out reward (0-1)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_demo(settings: Settings, options: DemoOptions) -> dict:
    return DemoRun(settings, options).run()


def cmd_demo(args: argparse.Namespace) -> int:
    if args.sync:
        args.placement = "colocated"
    placement = placement_from(args)
    if (threads := placement.trainer_threads()) is not None:
        import torch  # here for start-up time

        torch.set_num_threads(threads)  # the trainer's share; vLLM is pinned to the others
    if args.eval_samples < 1 or args.eval_every <= 0:
        raise CommandError("--eval-samples must be >= 1 and --eval-every > 0", code=2)
    try:
        trainer = trainer_overrides(args)
        TrainerConfig(**trainer)  # its checks, before anything starts
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None
    options = DemoOptions(
        seed=args.seed,
        minutes=args.minutes,
        placement=placement,
        preset=args.preset,
        trainer=trainer,
        out_dir=Path(args.out),
        eval_samples=args.eval_samples,
        eval_every_s=args.eval_every,
    )
    summary = run_demo(Settings(), options)
    return 0 if summary["gain"] > 0 else 1


def add_commands(add) -> None:
    p = add("demo", cmd_demo, "Agents learn a task online through the gateway; plots the reward.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    p.add_argument(
        "--sync", action="store_true", help="the same as --placement colocated (older name)"
    )
    p.add_argument(
        "--preset",
        default=DEFAULT_MODEL,
        choices=[DEFAULT_MODEL, TINY_PRESET],
        help=f"{DEFAULT_MODEL} (default: the real model learns small-number addition) or tiny "
        "(a random 90k-parameter model warm-started to copy four letters)",
    )
    add_placement_flags(p)
    add_trainer_flags(p, skip=("seed",))  # the demo's --seed seeds the trainer too
    p.add_argument("--out", default="demo-results", help="where the JSON and PNG go")
    defaults = DemoOptions()
    p.add_argument(
        "--eval-samples",
        type=int,
        default=defaults.eval_samples,
        help="samples of each held-out prompt per evaluation, at temperature 1 "
        f"(default {defaults.eval_samples}: {defaults.eval_samples * defaults.eval_prompts} "
        "per evaluation; bench/learning.py evaluates 500 before and after)",
    )
    p.add_argument(
        "--eval-every",
        type=float,
        default=defaults.eval_every_s,
        metavar="SECONDS",
        help=f"seconds between held-out evaluations (default {defaults.eval_every_s:g})",
    )
