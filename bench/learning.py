"""The learning benchmark: the real default model learns the demo task through the whole stack.

    .venv/bin/python bench/learning.py                      # full weights, shared, 3 seeds x 30 min
    .venv/bin/python bench/learning.py --modes full,lora --placements shared,separated,colocated
    .venv/bin/python bench/learning.py --quick              # the plumbing: 1 seed, 3 minutes

Each run is `rlgw demo`'s run (rlgw_cli/demo.py, DemoRun) in a process of its own: vLLM CPU
serving SmolLM2-135M-Instruct (Q4_1 dequantized to fp32: not the original bf16 release), the
gateway on a Postgres database, agents through the SDK and the official openai client at
temperature 1 posting 0/1 rewards on small-number addition (trainer/models/arithmetic_task.py),
and the online trainer with its default configuration (full weights; LoRA: lora_rank=8 and its
defaults). Per run:

- held-out success at temperature 1 BEFORE training (version 0) and AFTER --minutes of training
  (the clock starts once the first evaluation is done): 25 held-out pairs x --edge-eval-samples
  (default 20: 500 samples, a standard error of about 0.02); smaller evaluations in between
  (--eval-samples per pair, every --eval-every seconds) draw the curve;
- trained tokens per minute: the trainer's loss-bearing tokens (the versions' `tokens`) over the
  wall-clock of training;
- greedy answers of the base and of the trained model to a few general chat prompts, and the
  mean per-token KL(trained || base) over the trained model's answers (transformers, fp32).

Across seeds: the mean gain with its 95% t interval (one seed: none). Results under --out: each
run's JSON (runs/), summary.json, table.md (machine, date, command, tables, chat answers),
learning.png. The last line printed is one JSON object: the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learning_stats import (  # noqa: E402
    group_runs,
    groups_table,
    mean_or_none,
    proportion_se,
    runs_table,
    targets,
    token_kls,
    tokens_per_minute,
)
from trainer.config import TrainerConfig  # noqa: E402

MODES = {"full": {}, "lora": {"lora_rank": 8}}  # TrainerConfig fields; the rest its defaults
PLACEMENTS = ("shared", "separated", "colocated")
DEFAULT_PRESET = "smollm2-135m-instruct"  # rlgw_cli.models.DEFAULT_MODEL
HELD_OUT_PAIRS = 25  # arithmetic_task's held-out split
QUICK = {"seeds": "0", "minutes": 3.0, "eval_samples": 4, "edge_eval_samples": 4, "eval_every": 60}

CHAT_PROMPTS = (
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain in one sentence what a CPU does.",
    "Write a short thank-you note to a friend who helped me move.",
)
CHAT_MAX_NEW_TOKENS = 64


def log(message: str) -> None:
    print(f"[learning {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------- the chat sample


def _encode(tokenizer, text: str) -> list[int]:
    enc = tokenizer.apply_chat_template(
        [[{"role": "user", "content": text}]], tokenize=True, add_generation_prompt=True
    )
    return list(enc["input_ids"][0])


def greedy(model, prompt: list[int], eos: int, max_new_tokens: int) -> list[int]:
    """The greedy answer's token ids (the end marker included when reached)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        answer: list[int] = []
        for _ in range(max_new_tokens):
            token = int(out.logits[0, -1].argmax())
            answer.append(token)
            if token == eos:
                break
            out = model(
                input_ids=torch.tensor([[token]], device=device),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return answer


def answer_logprobs(model, prompt: list[int], answer: list[int]):
    """log_softmax of the model's next-token logits at each of the answer's positions [T, V]."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + answer], device=device)).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1).cpu()


def chat_sample(
    base_dir: Path,
    trained,
    prompts: tuple[str, ...] = CHAT_PROMPTS,
    max_new_tokens: int = CHAT_MAX_NEW_TOKENS,
) -> dict:
    """Greedy answers of the base checkpoint (before) and the trained model (after) to
    `prompts`, and KL(trained || base) per token over the trained model's answers."""
    from transformers import AutoTokenizer

    from trainer.models.weights import load_reference_model

    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    base = load_reference_model(base_dir)
    trained.eval()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows, every = [], []
    started = time.monotonic()
    for text in prompts:
        prompt = _encode(tokenizer, text)
        before = greedy(base, prompt, eos, max_new_tokens)
        after = greedy(trained, prompt, eos, max_new_tokens)
        kls = token_kls(
            answer_logprobs(trained, prompt, after), answer_logprobs(base, prompt, after)
        )
        every += kls
        rows.append(
            {
                "prompt": text,
                "before": tokenizer.decode(before, skip_special_tokens=True).strip(),
                "after": tokenizer.decode(after, skip_special_tokens=True).strip(),
                "after_tokens": len(after),
                "kl_mean": mean_or_none(kls),
                "kl_max": max(kls) if kls else None,
            }
        )
    del base
    return {
        "answers": rows,
        "kl_mean": mean_or_none(every),
        "kl_tokens": len(every),
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.monotonic() - started, 1),
    }


# --------------------------------------------------------------------------- one run (a child)


def point(p: dict) -> dict:
    """A curve point as the benchmark reports it: success, samples, standard error, version."""
    samples = p.get("samples") or 1
    return {
        "success": p["reward"],
        "samples": p.get("samples", 0),
        "se": round(proportion_se(p["reward"], samples), 4),
        "version": p["version"],
        "t": p["t"],
    }


def run_result(spec: dict, demo: dict, chat: dict, config: dict) -> dict:
    """One run's record, from the demo's summary, the chat sample and the trainer's config."""
    before, after = point(demo["curve"][0]), point(demo["curve"][-1])
    tokens, wall = demo["trainer_tokens"], demo["training_wall_s"]
    return {
        "name": spec["name"],
        "mode": spec["mode"],
        "placement": spec["placement"],
        "seed": spec["seed"],
        "minutes": spec["minutes"],
        "before": before,
        "after": after,
        "gain": round(after["success"] - before["success"], 4),
        "versions": after["version"],
        "trainer_tokens": tokens,
        "training_wall_s": wall,
        "tokens_per_minute": round(tokens_per_minute(tokens, wall), 1),
        "trainer_tokens_per_s": demo["trainer_tokens_per_s"],
        "groups_generated": demo["groups_generated"],
        "kl_mean": chat["kl_mean"],
        "chat": chat,
        "trainer_config": config,
        "curve": [point(p) for p in demo["curve"]],
        "served_model": demo["model"],
        "spec": spec,
    }


def run_one(spec: dict) -> int:
    """One demo run under `spec` (a child process of the benchmark); writes spec['result']."""
    import torch

    from rlgw.placement import Placement
    from rlgw.settings import Settings
    from rlgw_cli.demo import DemoOptions, DemoRun

    placement = Placement.choose(spec["placement"])
    if (threads := placement.trainer_threads()) is not None:
        torch.set_num_threads(threads)  # the trainer's share; vLLM is pinned to the others
    out = Path(spec["result"]).parent
    options = DemoOptions(
        seed=spec["seed"],
        minutes=spec["minutes"],
        placement=placement,
        preset=spec["preset"],
        eval_prompts=HELD_OUT_PAIRS,
        eval_samples=spec["eval_samples"],
        edge_eval_samples=spec["edge_eval_samples"],
        eval_every_s=spec["eval_every"],
        clock_after_baseline=True,
        drain_s=spec["drain_s"],
        concurrency=spec["concurrency"],
        trainer={**MODES[spec["mode"]], **spec.get("trainer", {})},
        out_dir=out / spec["name"],
    )
    demo_run = DemoRun(Settings(), options)
    demo = demo_run.run()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # vLLM is gone: every core
    log(f"{spec['name']}: greedy chat answers before/after and KL to the base")
    chat = chat_sample(demo_run.model_path, demo_run.trainer.model)
    result = run_result(spec, demo, chat, demo_run.trainer.config.as_dict())
    Path(spec["result"]).write_text(json.dumps(result, indent=2) + "\n")
    log(
        f"{spec['name']}: {result['before']['success']:.3f} -> {result['after']['success']:.3f} "
        f"({result['gain']:+.3f}), {result['versions']} versions, "
        f"{result['tokens_per_minute']:.0f} trained tokens/min, KL {chat['kl_mean']:.4f}"
    )
    return 0


# --------------------------------------------------------------------------- the benchmark


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "memory_gib": mem_gib}


def make_database(pg: str) -> str:
    """A fresh database on the server `pg` (libpq URI without a database), as a SQLAlchemy URL."""
    import psycopg

    from rlgw.db.urls import to_sqlalchemy_url

    name = f"rlgw_learning_{datetime.now(UTC):%Y%m%d_%H%M%S}_{uuid.uuid4().hex[:4]}"
    with psycopg.connect(f"{pg.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return to_sqlalchemy_url(f"{pg.rstrip('/')}/{name}")


def marked(marker: str) -> list[int]:
    """The processes whose environment carries `marker` (a run's child and what it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def stop_marked(marker: str) -> int:
    """Stop what a run left behind (its vLLM, when the run was killed): SIGTERM to the process
    groups of the marked processes, SIGKILL to those still there 20 s later."""
    pids = marked(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked(marker):
            with contextlib.suppress(OSError):
                group = os.getpgid(pid)
                if group == os.getpgrp():  # never this benchmark's own group
                    os.kill(pid, sig)
                else:
                    os.killpg(group, sig)
        deadline = time.monotonic() + 20
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
    return len(pids)


def exit_reason(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    name = signal.Signals(-code).name
    return f"killed by {name}" + (" (out of memory?)" if code == -signal.SIGKILL else "")


def child(spec: dict, env: dict[str, str], log_path: Path) -> dict:
    """Run one spec in a child process, its output echoed and kept in `log_path`; its result,
    or a record of the failure. Whatever the child started is stopped when it ends."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec)]
    mark = uuid.uuid4().hex
    env = {**env, "LEARNING_BENCH_RUN": mark}  # inherited by the vLLM the run starts
    marker = f"LEARNING_BENCH_RUN={mark}"
    with log_path.open("w") as kept:
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            kept.write(line)
        code = proc.wait()
    if left := stop_marked(marker):
        log(f"{spec['name']}: stopped {left} process(es) the run left behind")
    result = Path(spec["result"])
    if code == 0 and result.is_file():
        return json.loads(result.read_text())
    lines = log_path.read_text(errors="replace").strip().splitlines()
    last = next((x for x in reversed(lines) if "Error" in x), lines[-1] if lines else "no output")
    return {
        "name": spec["name"],
        "mode": spec["mode"],
        "placement": spec["placement"],
        "seed": spec["seed"],
        "error": f"{exit_reason(code)}: {last.strip()[:200]} (log {log_path})",
    }


def plot(runs: list[dict], path: Path) -> None:
    """Held-out success against minutes of training, one line per run; the before and after
    evaluations marked with their 95% binomial error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, r in enumerate(x for x in runs if "error" not in x):
        color = f"C{i % 10}"
        xs = [p["t"] / 60 for p in r["curve"]]
        ys = [p["success"] for p in r["curve"]]
        style = {"shared": "-", "separated": "-.", "colocated": "--"}[r["placement"]]
        label = f"{r['mode']} {r['placement']} seed {r['seed']} ({r['gain']:+.2f})"
        ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
        for end, marker in ((r["before"], "s"), (r["after"], "D")):
            ax.errorbar(
                end["t"] / 60,
                end["success"],
                yerr=1.96 * end["se"],
                fmt=marker,
                color=color,
                markersize=7,
                capsize=3,
            )
    ax.set_xlabel("minutes of training (wall clock)")
    ax.set_ylabel("held-out success at temperature 1")
    ax.set_ylim(0, 1)
    ax.set_title("before (square) and after (diamond): big evaluations, 95% error bars", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def chat_section(runs: list[dict]) -> str:
    lines = ["## General chat, greedy: base (before) and trained (after)", ""]
    for r in runs:
        if "error" in r:
            continue
        chat = r["chat"]
        lines.append(
            f"### {r['name']}: KL(trained ‖ base) {chat['kl_mean']:.4f} nats per token over "
            f"{chat['kl_tokens']} answer tokens"
        )
        lines.append("")
        lines.append("| prompt | before | after | KL per token |")
        lines.append("|---|---|---|---|")
        for a in chat["answers"]:
            cells = [a["prompt"], a["before"], a["after"]]
            cells = [c.replace("|", "\\|").replace("\n", " ⏎ ") for c in cells]
            kl = "-" if a["kl_mean"] is None else f"{a['kl_mean']:.4f}"
            lines.append(f"| {' | '.join(cells)} | {kl} |")
        lines.append("")
    return "\n".join(lines)


def report(runs: list[dict], header: dict, out: Path) -> dict:
    groups = group_runs(runs)
    met = targets(groups)
    m = header["machine"]
    lines = [
        "# Learning benchmark: SmolLM2-135M-Instruct learns small-number addition online",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB",
        f"- date: {header['date']}",
        f"- command: `{header['command']}`",
        f"- model: {header['model']}",
        f"- {header['budget']}",
        f"- held-out success at temperature 1: {header['evaluations']}; ± is one standard error "
        "(binomial)",
        "",
        "## Runs",
        "",
        runs_table(runs),
        "",
        "## Across seeds",
        "",
        groups_table(groups) if groups else "(no run finished)",
        "",
    ]
    if header["quick"]:
        lines += ["--quick: a plumbing check, not a measurement of the targets.", ""]
    else:
        lines += ["Targets (issue 26): " + "; ".join(f"{k}: {v}" for k, v in met.items()), ""]
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n" + chat_section(runs) + "\n")
    print("\n" + table, flush=True)
    if any("error" not in r for r in runs):
        plot(runs, out / "learning.png")
    summary = {
        "benchmark": "learning",
        "out": str(out),
        "quick": header["quick"],
        "runs": len(runs),
        "failed": sum("error" in r for r in runs),
        "groups": [
            {
                k: g[k]
                for k in (
                    "mode",
                    "placement",
                    "seeds",
                    "before_mean",
                    "after_mean",
                    "gain_mean",
                    "gain_ci95",
                    "per_seed_gain",
                    "tokens_per_minute_mean",
                    "kl_mean",
                )
            }
            for g in groups
        ],
        "targets": None if header["quick"] else met,
        "table": str(out / "table.md"),
        "plot": str(out / "learning.png"),
    }
    (out / "summary.json").write_text(json.dumps({**header, **summary}, indent=2) + "\n")
    return summary


def trainer_options(pairs: list[str]) -> dict[str, object]:
    """`--trainer FIELD=VALUE` pairs as TrainerConfig overrides (VALUE read as JSON, else text)."""
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    options: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--trainer {pair!r}: expected FIELD=VALUE with a TrainerConfig field")
        try:
            options[name] = json.loads(raw)
        except json.JSONDecodeError:
            options[name] = raw
    return options


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    p.add_argument("--minutes", type=float, default=30.0, help="of training, per run")
    p.add_argument("--modes", default="full", help="full (default), lora, or both: full,lora")
    p.add_argument(
        "--placements",
        default="shared",
        help="comma-separated: shared (default), separated, colocated",
    )
    p.add_argument(
        "--edge-eval-samples",
        type=int,
        default=20,
        help="samples of each of the 25 held-out pairs before and after (default 20: 500)",
    )
    p.add_argument(
        "--eval-samples", type=int, default=4, help="the same, in between (default 4: 100)"
    )
    p.add_argument(
        "--eval-every", type=float, default=300.0, help="seconds between evaluations (default 300)"
    )
    p.add_argument("--concurrency", type=int, default=24, help="sessions in flight at once")
    p.add_argument(
        "--drain", type=float, default=900.0, help="seconds an update in flight is waited for"
    )
    p.add_argument("--preset", default=DEFAULT_PRESET, help="rlgw demo's model preset")
    p.add_argument(
        "--trainer",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a TrainerConfig field over the mode's defaults (JSON value), e.g. batch_sessions=64; "
        "repeatable",
    )
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432", help="a new database")
    p.add_argument("--home", default="bench/results/learning-home", help="RLGW_HOME: models, logs")
    p.add_argument("--out", default=None, help="default bench/results/learning/<UTC time>")
    p.add_argument("--quick", action="store_true", help="1 seed, 3 minutes, evaluations of 100")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one run's spec
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one:
        return run_one(json.loads(args.one))
    modes, placements = args.modes.split(","), args.placements.split(",")
    if bad := [m for m in modes if m not in MODES] + [p for p in placements if p not in PLACEMENTS]:
        raise SystemExit(f"unknown mode or placement: {', '.join(bad)}")
    if args.edge_eval_samples * HELD_OUT_PAIRS < 500 and not args.quick:
        log(f"warning: {args.edge_eval_samples * HELD_OUT_PAIRS} samples per before/after "
            "evaluation; 500 give a standard error of about 0.02")  # fmt: skip
    started = datetime.now(UTC)
    out = Path(args.out or f"bench/results/learning/{started:%Y%m%d-%H%M%S}").resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    home = Path(args.home).resolve()
    database = os.environ.get("RLGW_DATABASE_URL") or make_database(args.pg)
    env = {**os.environ, "RLGW_HOME": str(home), "RLGW_DATABASE_URL": database}
    env["PYTHONUNBUFFERED"] = "1"  # its lines as they come
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    seeds = [int(s) for s in str(args.seeds).split(",")]
    header = {
        "machine": machine(),
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "command": " ".join(["python", *map(shlex.quote, sys.argv)]),
        "model": (
            f"{args.preset} (SmolLM2-135M-Instruct as shipped in Q4_1 GGUF, dequantized to fp32)"
            if args.preset == DEFAULT_PRESET
            else f"{args.preset} (rlgw demo's preset)"
        )
        + "; trainer defaults (full: TrainerConfig(); lora: TrainerConfig(lora_rank=8))"
        + (f", with {', '.join(args.trainer)}" if args.trainer else ""),
        "budget": f"{args.minutes:g} minutes of training per run (the clock starts after the "
        "first evaluation), then the update in flight is finished and the model evaluated",
        "evaluations": f"before/after {args.edge_eval_samples * HELD_OUT_PAIRS} samples "
        f"({HELD_OUT_PAIRS} held-out pairs x {args.edge_eval_samples}), in between "
        f"{args.eval_samples * HELD_OUT_PAIRS} every {args.eval_every:g} s",
        "quick": args.quick,
        "database": database,
    }
    log(f"{len(seeds) * len(modes) * len(placements)} run(s) into {out}; database {database}")
    runs = []
    for seed in seeds:
        for mode in modes:
            for placement in placements:
                name = f"{mode}-{placement}-seed{seed}"
                spec = {
                    "name": name,
                    "mode": mode,
                    "placement": placement,
                    "seed": seed,
                    "minutes": args.minutes,
                    "preset": args.preset,
                    "eval_samples": args.eval_samples,
                    "edge_eval_samples": args.edge_eval_samples,
                    "eval_every": args.eval_every,
                    "concurrency": args.concurrency,
                    "drain_s": args.drain,
                    "trainer": trainer_options(args.trainer),
                    "result": str(out / "runs" / f"{name}.json"),
                }
                log(f"run {len(runs) + 1}: {name}")
                runs.append(child(spec, env, out / "runs" / f"{name}.log"))
    summary = report(runs, header, out)
    print(json.dumps(summary), flush=True)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
