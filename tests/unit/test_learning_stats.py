"""The learning benchmark's statistics (bench/learning_stats.py) against values worked by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.learning_stats import (
    group_runs,
    groups_table,
    mean_interval,
    proportion_se,
    runs_table,
    samples_for_se,
    t_critical_95,
    targets,
    token_kls,
    tokens_per_minute,
)

# ---------------------------------------------------------------- t quantiles and intervals


def test_t_quantiles_from_the_table_and_beyond_it() -> None:
    assert t_critical_95(1) == 12.7062
    assert t_critical_95(2) == 4.3027
    assert t_critical_95(30) == 2.0423
    # published 0.975 quantiles past the table: 40 -> 2.0211, 60 -> 2.0003, 120 -> 1.9799
    assert t_critical_95(40) == pytest.approx(2.0211, abs=1e-4)
    assert t_critical_95(60) == pytest.approx(2.0003, abs=1e-4)
    assert t_critical_95(120) == pytest.approx(1.9799, abs=1e-4)
    with pytest.raises(ValueError):
        t_critical_95(0)


def test_interval_over_three_seeds() -> None:
    # mean 0.4; s = sqrt(((-0.1)^2 + 0.1^2 + 0) / 2) = 0.1; half = 4.3027 * 0.1 / sqrt(3)
    i = mean_interval([0.3, 0.5, 0.4])
    half = 4.3027 * 0.1 / math.sqrt(3)  # 0.24842
    assert i.mean == pytest.approx(0.4)
    assert i.low == pytest.approx(0.4 - half) and i.high == pytest.approx(0.4 + half)
    assert i.half_width == pytest.approx(0.24842, abs=1e-5)
    assert i.n == 3
    assert i.describe() == "+0.400 (95% CI +0.152 to +0.648, 3 seeds)"


def test_interval_over_two_seeds_is_wide() -> None:
    # s = 0.1 * sqrt(2); half = 12.7062 * 0.1 * sqrt(2) / sqrt(2) = 1.27062
    i = mean_interval([0.2, 0.4])
    assert i.mean == pytest.approx(0.3)
    assert i.low == pytest.approx(0.3 - 1.27062) and i.high == pytest.approx(0.3 + 1.27062)


def test_one_seed_has_no_interval_and_says_so() -> None:
    i = mean_interval([0.25])
    assert (i.mean, i.low, i.high, i.n, i.half_width) == (0.25, None, None, 1, None)
    assert i.describe() == "+0.250 (one seed: no interval)"
    with pytest.raises(ValueError):
        mean_interval([])


# ---------------------------------------------------------------- rates and throughput


def test_standard_error_of_a_success_rate() -> None:
    assert proportion_se(0.5, 500) == pytest.approx(math.sqrt(0.25 / 500))  # 0.02236
    assert proportion_se(0.2, 100) == pytest.approx(0.04)  # sqrt(0.16 / 100)
    assert proportion_se(0.0, 10) == 0.0
    with pytest.raises(ValueError):
        proportion_se(0.5, 0)
    with pytest.raises(ValueError):
        proportion_se(1.5, 10)


def test_samples_needed_for_a_standard_error() -> None:
    assert samples_for_se(0.02) == 625  # 0.25 / 0.0004
    assert samples_for_se(0.0224) == 499  # 0.25 / 0.00050176 = 498.2: 500 samples suffice
    assert samples_for_se(0.02, p=0.2) == 400  # 0.16 / 0.0004


def test_tokens_per_minute() -> None:
    assert tokens_per_minute(1200, 1800) == pytest.approx(40.0)
    assert tokens_per_minute(90, 45) == pytest.approx(120.0)
    assert tokens_per_minute(100, 0) == 0.0


# ---------------------------------------------------------------- KL


def test_token_kl_of_hand_worked_distributions() -> None:
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]]).log()
    q = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.2, 0.8]]).log()
    kls = token_kls(p, q)
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 (0.693147 - 0.405465)
    assert kls[0] == pytest.approx(0.143841, abs=1e-6)
    assert kls[1] == pytest.approx(math.log(2), abs=1e-6)  # 1 ln(1/0.5); 0 ln 0 counts as 0
    assert kls[2] == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError):
        token_kls(p, q[:, :1])


def test_token_kl_from_logits_is_not_symmetric() -> None:
    a = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0]]), -1)
    b = torch.log_softmax(torch.tensor([[0.0, 0.0, 0.0]]), -1)
    forward, backward = token_kls(a, b)[0], token_kls(b, a)[0]
    pa = a.exp()[0]
    assert forward == pytest.approx(float((pa * (a[0] - b[0])).sum()), abs=1e-6)
    assert forward != pytest.approx(backward)


# ---------------------------------------------------------------- runs, groups, tables


def run(mode: str, placement: str, seed: int, before: float, after: float, **extra) -> dict:
    point = lambda p: {"success": p, "se": proportion_se(p, 500), "samples": 500}  # noqa: E731
    return {
        "mode": mode,
        "placement": placement,
        "seed": seed,
        "before": point(before),
        "after": point(after),
        "gain": round(after - before, 4),
        "versions": 10,
        "tokens_per_minute": 60.0,
        "kl_mean": 0.01,
        **extra,
    }


def test_runs_group_by_mode_and_placement() -> None:
    runs = [
        run("full", "shared", 0, 0.2, 0.5),
        run("lora", "shared", 0, 0.2, 0.3, tokens_per_minute=90.0, kl_mean=None),
        run("full", "shared", 1, 0.2, 0.3, tokens_per_minute=30.0, kl_mean=0.03),
        {"mode": "full", "placement": "shared", "seed": 2, "error": "exit code 1"},
    ]
    full, lora = group_runs(runs)
    assert (full["mode"], full["placement"], full["seeds"]) == ("full", "shared", [0, 1])
    assert full["before_mean"] == pytest.approx(0.2) and full["after_mean"] == pytest.approx(0.4)
    assert full["gain_mean"] == pytest.approx(0.2)  # gains 0.3 and 0.1
    # s = 0.1 * sqrt(2); half = 12.7062 * s / sqrt(2) = 1.27062
    assert full["gain_ci95"] == pytest.approx([0.2 - 1.27062, 0.2 + 1.27062])
    assert full["per_seed_gain"] == [0.3, 0.1]
    assert full["seeds_reaching_target"] == 1
    assert full["tokens_per_minute_mean"] == pytest.approx(45.0)
    assert full["kl_mean"] == pytest.approx(0.02)
    assert lora["gain_ci95"] is None and lora["gain"] == "+0.100 (one seed: no interval)"
    assert lora["kl_mean"] is None


def test_targets_as_far_as_the_runs_tell() -> None:
    three = [run("full", "shared", s, 0.2, 0.5) for s in range(3)]
    assert list(targets(group_runs(three)).values()) == [True, None]
    short = [run("full", "shared", s, 0.2, 0.5) for s in range(2)]  # fewer than 3 seeds
    assert list(targets(group_runs(short)).values()) == [False, None]
    mixed = [*three[:2], run("full", "shared", 2, 0.2, 0.3), run("lora", "separated", 0, 0.2, 0.5)]
    assert list(targets(group_runs(mixed)).values()) == [False, True]
    assert list(targets(group_runs([run("full", "colocated", 0, 0.2, 0.6)])).values()) == [
        None,
        None,
    ]


def test_tables_show_every_run_and_group() -> None:
    runs = [run("full", "shared", 0, 0.2, 0.5), {"mode": "full", "placement": "shared", "seed": 1,
                                                 "error": "vLLM did not start"}]  # fmt: skip
    text = runs_table(runs)
    assert "| full | shared | 0 | 0.200 ± 0.018 (n=500) | 0.500 ± 0.022 (n=500) | +0.300 |" in text
    assert "| full | shared | 1 | failed: vLLM did not start |" in text
    table = groups_table(group_runs(runs))
    assert "| full | shared | 1 | 0.200 | 0.500 | +0.300 (one seed: no interval) | +0.300 " in table
    assert "| 1/1 | 60 | 0.0100 |" in table


# ---------------------------------------------------------------- the benchmark's records


def demo_summary() -> dict:
    """What DemoRun.report returns, reduced to what the benchmark reads."""
    return {
        "model": "demo-s0-shared-abc123",
        "curve": [
            {"t": 0.0, "version": 0, "reward": 0.2, "samples": 500},
            {"t": 300.0, "version": 6, "reward": 0.35, "samples": 100},
            {"t": 1850.0, "version": 21, "reward": 0.55, "samples": 500},
        ],
        "trainer_tokens": 27000,
        "training_wall_s": 1800.0,
        "trainer_tokens_per_s": 4.1,
        "groups_generated": 160,
    }


def test_a_run_record_from_the_demo_summary() -> None:
    from bench.learning import run_result

    spec = {"name": "full-shared-seed0", "mode": "full", "placement": "shared", "seed": 0,
            "minutes": 30.0}  # fmt: skip
    chat = {"kl_mean": 0.012, "kl_tokens": 200, "answers": []}
    r = run_result(spec, demo_summary(), chat, {"lr": 1e-5})
    assert r["before"] == {"success": 0.2, "samples": 500, "se": 0.0179, "version": 0, "t": 0.0}
    # sqrt(0.55 * 0.45 / 500) = 0.02225
    assert r["after"] == {"success": 0.55, "samples": 500, "se": 0.0222, "version": 21,
                          "t": 1850.0}  # fmt: skip
    assert r["gain"] == 0.35 and r["versions"] == 21
    assert r["tokens_per_minute"] == 900.0  # 27000 tokens over 30 minutes
    assert r["kl_mean"] == 0.012 and r["trainer_config"] == {"lr": 1e-5}
    assert [p["se"] for p in r["curve"]] == [0.0179, 0.0477, 0.0222]  # 0.35: sqrt(.2275/100)


def test_the_report_writes_its_table_summary_and_plot(tmp_path) -> None:
    from bench.learning import report, run_result

    spec = {"mode": "full", "placement": "shared", "minutes": 30.0}
    chat = {"kl_mean": 0.01, "kl_tokens": 3, "answers": [
        {"prompt": "Write a haiku about the sea.", "before": "Waves | foam", "after": "Waves\nfoam",
         "kl_mean": 0.01}]}  # fmt: skip
    runs = [
        run_result({**spec, "name": f"full-shared-seed{s}", "seed": s}, demo_summary(), chat, {})
        for s in (0, 1)
    ] + [{"name": "full-shared-seed2", "mode": "full", "placement": "shared", "seed": 2,
          "error": "exit code 1: boom"}]  # fmt: skip
    header = {"machine": {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0},
              "date": "2026-12-06 05:00 UTC", "command": "python bench/learning.py",
              "model": "m", "budget": "b", "evaluations": "e", "quick": False}  # fmt: skip
    summary = report(runs, header, tmp_path)
    assert summary["runs"] == 3 and summary["failed"] == 1
    (group,) = summary["groups"]
    assert group["seeds"] == [0, 1] and group["gain_mean"] == pytest.approx(0.35)
    assert group["gain_ci95"] == pytest.approx([0.35, 0.35])  # two equal gains: no spread
    assert summary["targets"] == {
        "full, shared: each of >= 3 seeds gains >= 0.25": False,  # 2 seeds finished
        "lora: one seed gains >= 0.25": None,
    }
    table = (tmp_path / "table.md").read_text()
    assert "- machine: Test CPU, 2 cores, 8.0 GiB" in table
    assert "- command: `python bench/learning.py`" in table
    assert "| full | shared | 2 | failed: exit code 1: boom |" in table
    assert "| Write a haiku about the sea. | Waves \\| foam | Waves ⏎ foam | 0.0100 |" in table
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["machine"]["cores"] == 2 and saved["failed"] == 1


def test_what_a_killed_run_left_behind_is_stopped() -> None:
    import subprocess
    import uuid

    from bench.learning import exit_reason, marked, stop_marked

    mark = uuid.uuid4().hex
    env = {"PATH": "/usr/bin:/bin", "LEARNING_BENCH_RUN": mark}
    # as a run's vLLM: a session of its own, the run's mark in its environment
    orphan = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    marker = f"LEARNING_BENCH_RUN={mark}"
    assert marked(marker) == [orphan.pid]
    assert stop_marked(marker) == 1
    assert orphan.wait(timeout=10) == -15  # SIGTERM
    assert marked(marker) == [] and stop_marked(marker) == 0
    assert exit_reason(3) == "exit code 3"
    assert exit_reason(-9) == "killed by SIGKILL (out of memory?)"
    assert exit_reason(-15) == "killed by SIGTERM"


def test_the_two_sample_ks_test_tells_same_from_shifted_distributions():
    import random

    from bench.learning_swaps import ks_two_sample

    rng = random.Random(0)
    a = [rng.gauss(0, 1) for _ in range(300)]
    same = [rng.gauss(0, 1) for _ in range(400)]
    shifted = [rng.gauss(0.4, 1) for _ in range(400)]
    d_same, p_same = ks_two_sample(a, same)
    d_shift, p_shift = ks_two_sample(a, shifted)
    assert p_same > 0.05 and p_shift < 1e-4 and d_shift > d_same
    assert ks_two_sample([1, 2, 3], [1, 2, 3]) == (0.0, 1.0)
    assert ks_two_sample([1, 2], [3, 4])[0] == 1.0  # disjoint samples: D = 1
