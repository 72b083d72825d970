"""The placement setting: validated once, with disjoint core sets for a separated placement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlgw.placement import WAIT_POLICY, Placement, format_cpus, parse_cpus, pinned_argv

FOUR = frozenset({0, 1, 2, 3})


def test_cpu_lists_parse_and_print() -> None:
    assert parse_cpus("0-2,5") == {0, 1, 2, 5} and format_cpus(frozenset({3, 1})) == "1,3"
    for bad in ("", "a", "3-1", "1-x"):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpus(bad)


def test_separated_splits_the_cores_when_none_are_named() -> None:
    two = Placement.choose("separated", available=frozenset({0, 1}))
    assert two.backend_cpus == {0} and two.trainer_cpus == {1}
    four = Placement.choose("separated", available=FOUR)
    assert four.backend_cpus == {0, 1} and four.trainer_cpus == {2, 3}
    named = Placement.choose("separated", trainer_cpus="3", available=FOUR)
    assert named.trainer_cpus == {3} and named.backend_cpus == {0, 1, 2}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"kind": "separated", "trainer_cpus": "0-1", "backend_cpus": "1-2"}, "disjoint"),
        ({"kind": "separated", "trainer_cpus": "0-3"}, "leaves no CPU"),
        ({"kind": "separated", "trainer_cpus": "7"}, "this machine offers 0,1,2,3"),
        ({"kind": "colocated", "trainer_cpus": "0"}, "need --placement separated"),
        ({"kind": "pipelined"}, "must be one of"),
    ],
)
def test_a_placement_that_cannot_hold_is_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Placement.choose(available=FOUR, **kwargs)


def test_only_colocated_pauses_generation_and_only_separated_pins() -> None:
    assert Placement.choose("colocated").pauses_generation
    assert not Placement.choose("shared").pauses_generation
    assert Placement.choose("shared").backend_env() == {}
    separated = Placement.choose("separated", available=FOUR)
    assert separated.backend_env() == {"OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0,1"}
    assert separated.trainer_threads() == 2 and Placement().trainer_threads() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_pinned_command_and_its_children_run_on_their_cores_only() -> None:
    cpu = min(os.sched_getaffinity(0))
    child = "import os, subprocess, sys; print(os.sched_getaffinity(0)); sys.stdout.flush(); "
    child += "subprocess.run([sys.executable, '-c', 'import os; print(os.sched_getaffinity(0))'])"
    done = subprocess.run(
        pinned_argv([sys.executable, "-c", child], frozenset({cpu})),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == [f"{{{cpu}}}", f"{{{cpu}}}"], done.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_trainer_pinned_to_its_cores_accepts_the_backends_cores_it_was_started_with():
    """`rlgw up --placement separated` starts the trainer pinned to its cores from birth; the
    trainer then validates the same core lists, the backends' included, and must accept them."""
    trainer, backend = sorted(os.sched_getaffinity(0))[-1], sorted(os.sched_getaffinity(0))[0]
    probe = (
        "import os, sys; from rlgw.placement import Placement; "
        f"os.sched_setaffinity(0, {{{trainer}}}); "
        f"p = Placement.choose('separated', trainer_cpus='{trainer}', backend_cpus='{backend}'); "
        "print(sorted(p.trainer_cpus), sorted(p.backend_cpus))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"[{trainer}]", f"[{backend}]"]


def test_openmp_threads_sleep_when_idle_only_where_generation_and_training_share_cores(
    monkeypatch,
) -> None:
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    assert Placement.choose("shared").openmp_env() == {WAIT_POLICY: "PASSIVE"}
    assert Placement.choose("colocated").openmp_env() == {}
    assert Placement.choose("separated", available=FOUR).openmp_env() == {}
    monkeypatch.setenv(WAIT_POLICY, "ACTIVE")
    assert Placement.choose("shared").openmp_env() == {}  # the user's own setting stands


# libgomp prints its settings when it loads under OMP_DISPLAY_ENV=VERBOSE; the spin count is what
# the wait policy decides (300000 spins by default, 0 when passive). A child started after the
# import (what vLLM is to the demo) prints its own, from the environment it inherits.
SPIN_PROBE = """
import os, subprocess, sys
from rlgw.placement import Placement
placement = Placement.choose(sys.argv[1], available=frozenset({0, 1}))
applied = placement.import_torch()
assert "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ, applied
assert placement.import_torch() == {}  # too late: the runtime has read its settings
print("child:", file=sys.stderr, flush=True)
subprocess.run([sys.executable, "-c", "import torch"], check=True)
"""


@pytest.mark.parametrize(("kind", "spins"), [("shared", "0"), ("colocated", "300000")])
def test_the_wait_policy_reaches_this_process_openmp_runtime_only(kind: str, spins: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    done = subprocess.run(
        [sys.executable, "-c", SPIN_PROBE, kind], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    own, child = done.stderr.split("child:")
    assert f"GOMP_SPINCOUNT = '{spins}'" in own, own
    assert "GOMP_SPINCOUNT = '300000'" in child, child
