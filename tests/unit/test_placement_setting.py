"""The placement setting: validated once, with disjoint core sets for a separated placement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlgw.placement import Placement, format_cpus, parse_cpus, pinned_argv

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
