"""The learning benchmark's statistics (bench/learning.py), as small pure functions.

- a held-out success rate's standard error (binomial: sqrt(p (1 - p) / n));
- a mean over seeds with its two-sided 95% interval from the t-distribution (n - 1 degrees of
  freedom; one seed has none);
- trained tokens per minute;
- the per-token KL(trained || base) of two models' next-token distributions;
- the runs grouped by (mode, placement), and the markdown tables of runs and groups.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TARGET_GAIN = 0.25  # issue 26: held-out success rises by at least 0.25 absolute in 30 minutes

# Two-sided 95% critical values of Student's t (the 0.975 quantile) for 1..30 degrees of freedom.
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959964


def t_critical_95(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom: a table up to 30, then
    the Cornish-Fisher expansion around the normal quantile (within 1e-4 from there on)."""
    if df < 1:
        raise ValueError("a t interval needs at least 1 degree of freedom (2 values)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values and its 95% interval (None with one value: no spread to go on)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def describe(self, unit: str = "seeds") -> str:
        if self.low is None:
            return f"{self.mean:+.3f} (one {unit.rstrip('s')}: no interval)"
        return f"{self.mean:+.3f} (95% CI {self.low:+.3f} to {self.high:+.3f}, {self.n} {unit})"


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of `values` with its two-sided 95% t interval: mean +- t(n-1) * s / sqrt(n),
    s the sample standard deviation. One value: the mean alone."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, None, None, 1)
    half = t_critical_95(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def proportion_se(p: float, n: int) -> float:
    """The standard error of a success rate `p` measured on `n` independent 0/1 samples."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if not 0.0 <= p <= 1.0:
        raise ValueError("p is a rate in [0, 1]")
    return math.sqrt(p * (1.0 - p) / n)


def samples_for_se(se: float, p: float = 0.5) -> int:
    """Samples needed for a standard error of at most `se` at rate `p` (0.5: the worst case)."""
    return math.ceil(p * (1.0 - p) / se**2 - 1e-9)  # 400.00000000000006 is 400


def tokens_per_minute(tokens: float, seconds: float) -> float:
    """Trained tokens per wall-clock minute (0 over no time)."""
    return tokens * 60.0 / seconds if seconds > 0 else 0.0


def token_kls(logp_p, logp_q) -> list[float]:
    """KL(p || q) at each position, in nats: sum_v p(v) (log p(v) - log q(v)).

    `logp_p`, `logp_q`: torch tensors [tokens, vocab] of log-probabilities (log_softmax of each
    model's logits at the same positions); p is the trained model, q the base."""
    import torch

    p = logp_p.double()
    q = logp_q.double()
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {tuple(p.shape)} vs {tuple(q.shape)}")
    terms = p.exp() * (p - q)
    kl = torch.where(torch.isneginf(p), torch.zeros_like(terms), terms).sum(-1)  # 0 log 0 = 0
    return [float(x) for x in torch.clamp(kl, min=0.0)]  # rounding can dip below 0 by ~1e-12


def mean_or_none(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


# --------------------------------------------------------------------------- runs and groups


def group_runs(runs: Sequence[dict], target: float = TARGET_GAIN) -> list[dict]:
    """The finished runs grouped by (mode, placement), in the order first seen: seeds, mean
    before/after, the gain's mean and 95% interval over seeds, the seeds that gained `target`,
    the mean trained tokens per minute and KL. Runs with an `error` are left out."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        if "error" not in run:
            groups.setdefault((run["mode"], run["placement"]), []).append(run)
    out = []
    for (mode, placement), members in groups.items():
        gains = [r["gain"] for r in members]
        interval = mean_interval(gains)
        kls = [r["kl_mean"] for r in members if r.get("kl_mean") is not None]
        out.append(
            {
                "mode": mode,
                "placement": placement,
                "seeds": [r["seed"] for r in members],
                "before_mean": statistics.fmean(r["before"]["success"] for r in members),
                "after_mean": statistics.fmean(r["after"]["success"] for r in members),
                "gain_mean": interval.mean,
                "gain_ci95": None if interval.low is None else [interval.low, interval.high],
                "gain": interval.describe(),
                "per_seed_gain": gains,
                "seeds_reaching_target": sum(g >= target for g in gains),
                "tokens_per_minute_mean": statistics.fmean(r["tokens_per_minute"] for r in members),
                "kl_mean": mean_or_none(kls),
            }
        )
    return out


def targets(groups: Sequence[dict], target: float = TARGET_GAIN) -> dict[str, bool | None]:
    """Issue 26's targets, as far as these groups tell (None: not run here). Full weights with
    the defaults (the shared placement, no flags): every one of at least 3 seeds gains `target`;
    LoRA with its defaults: at least one seed does (any placement)."""
    full = next((g for g in groups if g["mode"] == "full" and g["placement"] == "shared"), None)
    lora = [g for g in groups if g["mode"] == "lora"]
    return {
        f"full, shared: each of >= 3 seeds gains >= {target}": None
        if full is None
        else len(full["seeds"]) >= 3 and full["seeds_reaching_target"] == len(full["seeds"]),
        f"lora: one seed gains >= {target}": None
        if not lora
        else any(g["seeds_reaching_target"] for g in lora),
    }


def _rate(point: dict) -> str:
    return f"{point['success']:.3f} ± {point['se']:.3f} (n={point['samples']})"


def _kl(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def runs_table(runs: Sequence[dict]) -> str:
    """One row per run: before and after (± one standard error, n samples), the gain, versions,
    trained tokens per minute, KL to the base on the chat sample; failed runs say why."""
    lines = [
        "| mode | placement | seed | before | after | gain | versions | trained tokens/min "
        "| KL(trained ‖ base) per token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            lines.append(
                f"| {r['mode']} | {r['placement']} | {r['seed']} | failed: {r['error']} | | | | | |"
            )
            continue
        lines.append(
            f"| {r['mode']} | {r['placement']} | {r['seed']} | {_rate(r['before'])} "
            f"| {_rate(r['after'])} | {r['gain']:+.3f} | {r['versions']} "
            f"| {r['tokens_per_minute']:.0f} | {_kl(r.get('kl_mean'))} |"
        )
    return "\n".join(lines)


def groups_table(groups: Sequence[dict], target: float = TARGET_GAIN) -> str:
    """One row per (mode, placement): mean before/after, the mean gain with its 95% interval
    over seeds, per-seed gains, seeds reaching the target, tokens per minute, KL."""
    lines = [
        "| mode | placement | seeds | mean before | mean after | mean gain (95% CI over seeds) "
        f"| per-seed gain | seeds ≥ +{target} | trained tokens/min | KL per token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        per_seed = ", ".join(f"{x:+.3f}" for x in g["per_seed_gain"])
        lines.append(
            f"| {g['mode']} | {g['placement']} | {len(g['seeds'])} | {g['before_mean']:.3f} "
            f"| {g['after_mean']:.3f} | {g['gain']} | {per_seed} "
            f"| {g['seeds_reaching_target']}/{len(g['seeds'])} "
            f"| {g['tokens_per_minute_mean']:.0f} | {_kl(g['kl_mean'])} |"
        )
    return "\n".join(lines)
