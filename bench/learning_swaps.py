"""What weight swaps cost a learning run's record: answers excluded at swaps, and whether the
answers trained on are distributed like the answers served (length, two-sample KS test).

    .venv/bin/python bench/learning_swaps.py --database postgresql://.../rlgw_learning_x [--model M]

Reads a learning benchmark's database (bench/learning.py keeps it) after the run:
- served: every completion of the model in a rewarded session (the agents' training traffic; the
  evaluations are not rewarded);
- excluded at a swap: those whose ineligibility names a swap (crossed one, weights that failed
  verification) or that the backend aborted (a drain that timed out);
- trained: the completions the ledger says an update used; claimed: every completion the ledger
  lists (used, or skipped with a reason such as staleness): the traffic of the same time window
  (served includes what was generated after the last claim, by a model that kept changing), and
  served until the newest claimed completion was created;
- the two-sample Kolmogorov-Smirnov test of output lengths, trained vs served (asymptotic p-value,
  Stephens' small-sample correction), and the versions per token of answers a swap continued.
The last line printed is the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence

SWAP_WORDS = ("weight swap", "failed verification", "aborted")


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The KS statistic D of samples `a` and `b` and its asymptotic two-sided p-value."""
    if not a or not b:
        return float("nan"), float("nan")
    xs, ys = sorted(a), sorted(b)
    n, m = len(xs), len(ys)
    i = j = 0
    d = 0.0
    for value in sorted(set(xs) | set(ys)):
        while i < n and xs[i] <= value:
            i += 1
        while j < m and ys[j] <= value:
            j += 1
        d = max(d, abs(i / n - j / m))
    en = math.sqrt(n * m / (n + m))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 1e-3:
        return d, 1.0
    p = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * (k * lam) ** 2) for k in range(1, 101))
    return d, min(max(p, 0.0), 1.0)


def analyse(database: str, model: str | None) -> dict:
    import psycopg

    url = database.replace("postgresql+psycopg://", "postgresql://")
    where_model = "AND c.model = %(model)s" if model else ""
    with psycopg.connect(url) as conn:
        has_versions = conn.execute(  # a database of the code before per-token versions
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'completions' AND column_name = 'output_versions'"
        ).fetchone()[0]
        versioned = "c.output_versions IS NOT NULL" if has_versions else "false"
        served = conn.execute(
            f"""SELECT c.id, octet_length(c.output_token_ids) / 4, c.status, c.status_reason,
                       c.ineligible_reasons, {versioned}, c.created_at
                FROM completions c
                WHERE EXISTS (SELECT 1 FROM rewards r WHERE r.session_id = c.session_id)
                {where_model}""",
            {"model": model},
        ).fetchall()
        ledger = conn.execute(
            f"""SELECT octet_length(c.output_token_ids) / 4, k.used, c.created_at
                FROM consumption k JOIN completions c ON c.id = k.completion_id
                WHERE true {where_model}""",
            {"model": model},
        ).fetchall()
    lengths = [int(r[1] or 0) for r in served]
    trained_lengths = [int(r[0] or 0) for r in ledger if r[1]]
    claimed_lengths = [int(r[0] or 0) for r in ledger]
    excluded = [
        r for r in served if any(w in " ".join([r[3] or "", *(r[4] or [])]) for w in SWAP_WORDS)
    ]
    d, p = ks_two_sample(trained_lengths, lengths)
    d_claimed, p_claimed = ks_two_sample(trained_lengths, claimed_lengths)
    last = max((r[2] for r in ledger), default=None)
    window = [int(r[1] or 0) for r in served if last is not None and r[6] <= last]
    d_window, p_window = ks_two_sample(trained_lengths, window)
    return {
        "served": len(served),
        "excluded_at_swaps": len(excluded),
        "excluded_examples": [
            {"id": r[0], "status": r[2], "reasons": r[4], "tokens": r[1]} for r in excluded[:5]
        ],
        "continued_across_a_swap": sum(bool(r[5]) for r in served),
        "trained": len(trained_lengths),
        "served_mean_tokens": sum(lengths) / max(len(lengths), 1),
        "trained_mean_tokens": sum(trained_lengths) / max(len(trained_lengths), 1),
        "ks_d": d,
        "ks_p": p,
        "ks_rejects_at_5pct": bool(p < 0.05) if p == p else None,
        "claimed": len(claimed_lengths),
        "claimed_mean_tokens": sum(claimed_lengths) / max(len(claimed_lengths), 1),
        "ks_trained_vs_claimed_d": d_claimed,
        "ks_trained_vs_claimed_p": p_claimed,
        "served_until_last_claimed": len(window),
        "ks_trained_vs_served_until_last_claimed_d": d_window,
        "ks_trained_vs_served_until_last_claimed_p": p_window,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database", required=True, help="the learning benchmark's database URL")
    p.add_argument("--model", default=None, help="only this served model's completions")
    args = p.parse_args(argv)
    print(json.dumps(analyse(args.database, args.model)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
