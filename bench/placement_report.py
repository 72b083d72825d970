"""The placement benchmark's figures: per run (useful work, memory, paused and sync time,
rejections by reason, restart recovery, held-out reward, exactness against the agents' ledger),
then per placement, the table, the plot, and a verdict on the falsifier."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from bench.placement_run import RunResult
from trainer.loop.tracking import rejection_kind


def exactness(result: RunResult) -> dict:
    """Every step of every consumed session's exported trajectory against what the agent saw:
    the same completion, the same output token ids, the same log-probs (float32)."""
    used = {(c["session_id"], c["completion_id"]) for c in result.rows["consumption"] if c["used"]}
    checked = mismatches = 0
    examples: list[str] = []
    for session_id, completion_id in sorted(used):
        seen = result.ledger.seen.get(completion_id)
        step = next(
            (
                s
                for s in result.exports.get(session_id, {}).get("steps", [])
                if s["completion_id"] == completion_id
            ),
            None,
        )
        checked += 1
        problem = None
        if seen is None:
            problem = "trained on a completion the agent never used"
        elif step is None:
            problem = "the export lacks the trained completion"
        elif list(seen.output_token_ids) != step["output_token_ids"]:
            problem = "output token ids differ"
        elif not np.array_equal(
            np.float32(seen.output_logprobs), np.float32(step["output_logprobs"])
        ):
            problem = "log-probs differ"
        if problem:
            mismatches += 1
            if len(examples) < 5:
                examples.append(f"{completion_id}: {problem}")
    return {"checked": checked, "mismatches": mismatches, "examples": examples}


def rejections(rows: dict) -> dict[str, int]:
    """Every training completion that was not trained on, under one reason: a retry orphan, an
    incomplete answer, a crossed swap, another ineligibility, else the trainer's skip reason
    (stale, pending siblings, ...), else not consumed (unrewarded, dropped, or the run ended)."""
    skipped = {c["completion_id"]: c["reason"] for c in rows["consumption"] if not c["used"]}
    used = {c["completion_id"] for c in rows["consumption"] if c["used"]}
    kinds: Counter = Counter()
    for c in rows["completions"]:
        if not c["train"] or c["id"] in used:
            continue
        if c["orphan"]:
            kinds["retry_orphan"] += 1
        elif c["status"] != "complete":
            kinds["incomplete"] += 1
        elif any("swap" in r for r in c["reasons"]):
            kinds["crossed_swap"] += 1
        elif c["reasons"]:
            kinds["not_eligible"] += 1
        elif c["id"] in skipped:
            kinds[rejection_kind(skipped[c["id"]])] += 1
        else:
            kinds["not_consumed"] += 1
    return dict(sorted(kinds.items()))


def run_figures(result: RunResult) -> dict:
    rows, spec = result.rows, result.spec
    minutes = (result.ended_wall - result.started_wall) / 60
    window = [c for c in rows["completions"] if c["train"]]
    trained = sum(c["tokens"] for c in rows["consumption"] if c["used"])
    versions = [v for v in rows["versions"] if v["version"] > 0]
    metric = lambda key: [float(v["metrics"].get(key, 0.0)) for v in versions]  # noqa: E731
    rejected = rejections(rows)
    recovery = None
    if result.kill_wall is not None:
        after = [v["created_at"] for v in versions if v["created_at"] > result.kill_wall]
        recovery = round(min(after) - result.kill_wall, 1) if after else None
    curve = result.curve
    return {
        "run": spec.name,
        "placement": spec.placement.describe(),
        "kind": spec.placement.kind,
        "seed": spec.seed,
        "minutes": round(minutes, 2),
        "versions": len(versions),
        "trained_tokens_per_min": round(trained / minutes, 1),
        "generated_tokens_per_min": round(sum(c["output_tokens"] for c in window) / minutes, 1),
        "peak_rss_mb": result.peak_rss_mb,
        "train_s": round(sum(metric("train_s")), 1),
        "weight_sync_s": round(  # whole step minus training, where the step finished
            sum(
                v["metrics"]["step_s"] - v["metrics"].get("train_s", 0.0)
                for v in versions
                if "step_s" in v["metrics"]
            ),
            1,
        ),
        "generation_paused_s": round(sum(metric("hold_s")) + sum(metric("pause_s")), 1),
        "sleep_wake_offload_s": 0.0,  # the CPU build's /sleep is a no-op; nothing is offloaded
        "rejected": rejected,
        "dropped_sessions": rows["dropped_sessions"],
        "faults_injected": dict(result.ledger.faults),
        "failed_requests": len([f for f in result.ledger.failed if "late reward" not in f]),
        "restart_recovery_s": recovery,
        "held_out_start": curve[0]["reward"],
        "held_out_final": curve[-1]["reward"],
        "held_out_gain": round(curve[-1]["reward"] - curve[0]["reward"], 4),
        "curve": curve,
        "exactness": exactness(result),
    }


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def summarize(figures: list[dict]) -> dict:
    by_kind: dict[str, list[dict]] = {}
    for f in figures:
        by_kind.setdefault(f["kind"], []).append(f)
    summary = {
        kind: {
            "runs": len(runs),
            "trained_tokens_per_min": statistics.mean(r["trained_tokens_per_min"] for r in runs),
            "trained_spread": _spread([r["trained_tokens_per_min"] for r in runs]),
            "held_out_gain": statistics.mean(r["held_out_gain"] for r in runs),
            "all_gain_0.3": all(r["held_out_gain"] >= 0.3 for r in runs),
            "mismatches": sum(r["exactness"]["mismatches"] for r in runs),
            "failed_requests": sum(r["failed_requests"] for r in runs),
        }
        for kind, runs in by_kind.items()
    }
    return {"per_placement": summary, "verdict": verdict(summary)}


def verdict(summary: dict) -> str:
    """Which placement trained more per minute, and whether by more than the seed spread."""
    if not {"separated", "colocated"} <= set(summary):
        return "needs both placements"
    rate = {k: summary[k]["trained_tokens_per_min"] for k in ("separated", "colocated")}
    fast, slow = sorted(rate, key=rate.get, reverse=True)
    ratio = rate[fast] / max(rate[slow], 1e-9)
    gap = rate[fast] - rate[slow]
    spread = max(summary[k]["trained_spread"] for k in rate)
    if gap <= spread:
        return (
            f"tie: {fast} trains {ratio:.2f}x the tokens per minute of {slow}, a gap of "
            f"{gap:.0f} within the seed-to-seed spread ({spread:.0f})"
        )
    goal = "met" if ratio >= 1.5 else "missed"
    return (
        f"{fast} wins: {ratio:.2f}x the trained tokens per minute of {slow}, beyond the "
        f"seed-to-seed spread ({gap:.0f} > {spread:.0f}); the 1.5x goal is {goal}"
    )


def table(figures: list[dict]) -> str:
    lines = [
        "| run | versions | trained tok/min | generated tok/min | paused gen (s) | weight sync (s)"
        " | rejected | recovery (s) | held-out start -> end (gain) | peak RSS vLLM / trainer (MB)"
        " | mismatches |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        rss = f["peak_rss_mb"]
        rejected = ", ".join(f"{k} {v}" for k, v in f["rejected"].items()) or "none"
        lines.append(
            f"| {f['run']} | {f['versions']} | {f['trained_tokens_per_min']:.0f} | "
            f"{f['generated_tokens_per_min']:.0f} | {f['generation_paused_s']:.1f} | "
            f"{f['weight_sync_s']:.1f} | {rejected} | {f['restart_recovery_s']} | "
            f"{f['held_out_start']:.3f} -> {f['held_out_final']:.3f} ({f['held_out_gain']:+.3f}) | "
            f"{rss.get('vllm', 0):.0f} / {rss.get('trainer', 0):.0f} | "
            f"{f['exactness']['mismatches']} of {f['exactness']['checked']} |"
        )
    return "\n".join(lines)


def plot(figures: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for f in figures:
        xs = [p["t"] / 60 for p in f["curve"]]
        ys = [p["reward"] for p in f["curve"]]
        style = "-" if f["kind"] == "separated" else "--"
        left.plot(xs, ys, style, marker="o", markersize=3, label=f["run"])
    left.set_xlabel("wall-clock minutes")
    left.set_ylabel("held-out reward")
    left.set_ylim(0, 1)
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    names = [f["run"] for f in figures]
    right.bar(
        names, [f["trained_tokens_per_min"] for f in figures], color="tab:blue", label="trained"
    )
    right.set_ylabel("eligible rewarded output tokens trained / min")
    right.tick_params(axis="x", rotation=30, labelsize=7)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
