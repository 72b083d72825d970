"""Held-out reward per wall-clock minute, async vs --sync, over several seeds, in one run.

    .venv/bin/python bench/demo_async_vs_sync.py [--seeds 0,1,2] [--minutes 10]

Each (seed, mode) is one full `rlgw demo` run (its own vLLM backend and model name); results go to
bench/results/demo/ as JSON per run, a combined PNG and a markdown table, including the trainer's
tokens per second (output tokens trained on / time in the optimizer, and / time in whole update
steps: train, write the delta, swap).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlgw.cli.demo import DemoOptions, plot_curves, run_demo  # noqa: E402
from rlgw.placement import Placement  # noqa: E402
from rlgw.settings import Settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--out", default="bench/results/demo")
    args = parser.parse_args()
    out = Path(args.out)
    summaries = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for mode in args.modes.split(","):
            print(f"\n[bench] seed {seed} {mode}: {args.minutes:g} min", flush=True)
            placement = Placement.choose("colocated" if mode == "sync" else "shared")
            options = DemoOptions(seed=seed, minutes=args.minutes, placement=placement, out_dir=out)
            summaries.append(run_demo(Settings(), options))
    plot_curves(summaries, out / "async-vs-sync.png")
    lines = [
        "| mode | seed | start | final | gain | best | versions | trainer tok/s (update / step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['mode']} | {s['seed']} | {s['start_reward']:.3f} | "
            f"{s['final_reward']:.3f} | {s['gain']:+.3f} | {s['best_reward']:.3f} | "
            f"{s['versions']} | {s.get('trainer_tokens_per_s', 0):.0f} / "
            f"{s.get('trainer_step_tokens_per_s', 0):.0f} |"
        )
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    (out / "summary.json").write_text(
        json.dumps(
            {"date": datetime.now(UTC).isoformat(), "minutes": args.minutes, "runs": summaries},
            indent=2,
        )
    )
    print("\n" + table)


if __name__ == "__main__":
    main()
