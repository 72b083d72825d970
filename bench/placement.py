"""The paired placement benchmark: separated vs colocated on the same model, task, reward,
wall-clock budget and machine, several seeds each, back to back in one invocation.

    .venv/bin/python bench/placement.py --seeds 0,1,2 --minutes 10   # the published run
    .venv/bin/python bench/placement.py --quick                      # one seed, 1 minute each

Each run starts its own vLLM (pinned to the backend cores when separated), `rlgw serve` on a
fresh database and `rlgw train --placement ...`; agents play the demo task
(trainer/models/demo_task.py) from the warm-started policy with client retries, disconnects and
delayed rewards injected; the trainer is killed once mid-run and restarted. Results: JSON per run, a
summary with the verdict, a markdown table and a PNG under --out (docs/benchmarks.md, "Placement",
shows them).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.placement_agents import Faults  # noqa: E402
from bench.placement_report import plot, run_figures, summarize, table  # noqa: E402
from bench.placement_run import RunSpec, run  # noqa: E402
from bench.processes import log  # noqa: E402
from rlgw.placement import Placement  # noqa: E402

QUICK = {  # small enough for the test suite: a few versions per placement in about a minute
    "minutes": 1.0,
    "group_size": 4,
    "groups_per_update": 2,
    "agents": 2,
    "concurrency": 8,
    "eval_prompts": 8,
    "eval_samples": 1,
    "eval_every_s": 20.0,
    "faults": Faults(reward_delay_s=(2.0, 8.0)),
}


def model_for(seed: int, home: Path) -> Path:
    """The demo's warm-started policy for `seed` (built once, then reused)."""
    from trainer.models.warm_start import init_demo_model

    path = home / "models" / f"demo-seed{seed}"
    if not (path / "rlgw_model.json").exists():
        log(f"warm-starting the policy for seed {seed}")
        init_demo_model(path, seed=seed, overwrite=True)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--placements", default="separated,colocated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--trainer-cpus", default=None, help="separated: the trainer's CPUs")
    p.add_argument("--backend-cpus", default=None, help="separated: vLLM's CPUs")
    p.add_argument("--model", default=None, help="a model directory instead of the demo policy")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    p.add_argument("--home", default="bench/results/placement-home", help="models, logs")
    p.add_argument("--out", default="bench/results/placement")
    p.add_argument("--quick", action="store_true", help="one seed, one minute, small batches")
    args = p.parse_args(argv)
    home, out = Path(args.home).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    figures = []
    for seed in seeds:
        for kind in args.placements.split(","):
            placement = Placement.choose(
                kind,
                **(
                    {"trainer_cpus": args.trainer_cpus, "backend_cpus": args.backend_cpus}
                    if kind == "separated"
                    else {}
                ),
            )
            spec = RunSpec(
                placement=placement,
                seed=seed,
                minutes=args.minutes,
                model_dir=Path(args.model) if args.model else model_for(seed, home),
                home=home / "runs" / f"{kind}-seed{seed}-{datetime.now(UTC):%H%M%S}",
                pg=args.pg,
            )
            if args.quick:
                spec = replace(spec, **QUICK)
            figure = run_figures(run(spec))
            (out / f"{spec.name}.json").write_text(json.dumps(figure, indent=2))
            brief = ("versions", "trained_tokens_per_min", "held_out_gain", "exactness")
            log(f"{spec.name}: {json.dumps({k: figure[k] for k in brief})}")
            figures.append(figure)
    summary = {"date": datetime.now(UTC).isoformat(), "argv": sys.argv[1:], **summarize(figures)}
    (out / "summary.json").write_text(json.dumps({**summary, "runs": figures}, indent=2))
    (out / "table.md").write_text(table(figures) + "\n")
    plot(figures, out / "placement.png")
    print("\n" + table(figures) + "\n\n" + summary["verdict"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
