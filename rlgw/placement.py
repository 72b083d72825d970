"""Placement: where generation (the vLLM backends) and training run, and whether generation
pauses while the trainer updates. One setting, read here; the launcher, the trainer and the demo
ask this object and never decide it themselves (docs/architecture.md, "Placement").

    shared     (default) both at once, on whatever cores or devices the OS gives them
    separated  both at once, on disjoint resources: CPU core sets (vLLM pinned to the backend
               cores, the trainer to its own, thread counts to match), or different GPUs
    colocated  one pool, time-shared: when an update is due the trainer takes the model's
               backends out of routing (requests wait at the gateway, bounded) and pauses them
               in place (the answers in flight freeze), trains with every core, swaps the new
               version in (verified) and generation resumes

On the CPU build vLLM's /sleep is a no-op, so colocated time-shares the cores only: the trainer
gets all of them while generation is paused. On GPUs a colocated trainer would also put vLLM to
sleep and move its own state onto the device (not measured: no GPU build of vLLM runs here).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PlacementKind = Literal["shared", "separated", "colocated"]
KINDS: tuple[str, ...] = ("shared", "separated", "colocated")
Role = Literal["trainer", "backend"]


def parse_cpus(text: str) -> frozenset[int]:
    """'0-3,6' -> {0, 1, 2, 3, 6}; ValueError on anything else."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (write e.g. 0-3,6)")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise ValueError(f"not a CPU list: {text!r} ({part} runs backwards)")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise ValueError(f"not a CPU list: {text!r}")
    return frozenset(cpus)


def format_cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (what a default split divides)."""
    return frozenset(os.sched_getaffinity(0))


def machine_cpus() -> frozenset[int]:
    """The CPUs of this machine (its cgroup's cpuset where one is set), whatever this process is
    pinned to: a trainer pinned to its own cores from birth still checks the backends' cores
    against the machine, not against its own mask."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"):
        try:
            return parse_cpus(Path(path).read_text().strip())
        except (OSError, ValueError):
            continue
    return frozenset(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Placement:
    kind: PlacementKind = "shared"
    trainer_cpus: frozenset[int] | None = None  # separated: the trainer's cores
    backend_cpus: frozenset[int] | None = None  # separated: every backend's cores

    @classmethod
    def choose(
        cls,
        kind: str = "shared",
        *,
        trainer_cpus: str | None = None,
        backend_cpus: str | None = None,
        available: frozenset[int] | None = None,
    ) -> Placement:
        """Validated placement. Separated without core lists splits this process's cores: the
        first half (rounded up) to the backends, the rest to the trainer (2 cores: 1 + 1)."""
        if kind not in KINDS:
            raise ValueError(f"placement must be one of {', '.join(KINDS)}, not {kind!r}")
        if kind != "separated":
            if trainer_cpus or backend_cpus:
                raise ValueError("--trainer-cpus / --backend-cpus need --placement separated")
            return cls(kind)  # type: ignore[arg-type]
        pool = available if available is not None else available_cpus()
        machine = available if available is not None else pool | machine_cpus()
        trainer = parse_cpus(trainer_cpus) if trainer_cpus else None
        backend = parse_cpus(backend_cpus) if backend_cpus else None
        if trainer is None and backend is None:
            if len(pool) < 2:
                raise ValueError("separated placement needs at least 2 CPUs (this process has 1)")
            ordered = sorted(pool)
            half = (len(ordered) + 1) // 2
            backend, trainer = frozenset(ordered[:half]), frozenset(ordered[half:])
        elif trainer is None:
            trainer = pool - backend
        elif backend is None:
            backend = pool - trainer
        if not trainer or not backend:
            raise ValueError("separated placement leaves no CPU for the trainer or the backends")
        if trainer & backend:
            raise ValueError(
                f"separated placement needs disjoint CPUs: {format_cpus(trainer & backend)} "
                "is given to both the trainer and the backends"
            )
        for name, cpus in (("trainer", trainer), ("backend", backend)):
            if not cpus <= machine:
                raise ValueError(
                    f"--{name}-cpus {format_cpus(cpus)}: this machine offers {format_cpus(machine)}"
                )
        return cls("separated", trainer, backend)

    @property
    def pauses_generation(self) -> bool:
        """True when generation stops while the trainer updates (time-shared)."""
        return self.kind == "colocated"

    def cpus(self, role: Role) -> frozenset[int] | None:
        """The cores `role` is pinned to; None: not pinned."""
        return self.trainer_cpus if role == "trainer" else self.backend_cpus

    def backend_env(self) -> dict[str, str]:
        """Environment for a vLLM CPU server: its OpenMP threads match and bind its cores."""
        cpus = self.cpus("backend")
        if cpus is None:
            return {}
        return {"OMP_NUM_THREADS": str(len(cpus)), "VLLM_CPU_OMP_THREADS_BIND": format_cpus(cpus)}

    def trainer_threads(self) -> int | None:
        """torch's intra-op threads for the trainer; None: torch's default (every core)."""
        cpus = self.cpus("trainer")
        return len(cpus) if cpus is not None else None

    def pin(self, role: Role, pid: int = 0) -> None:
        """Pin a process (0: this one) to the role's cores; children inherit the mask."""
        cpus = self.cpus(role)
        if cpus is not None:
            os.sched_setaffinity(pid, cpus)

    def describe(self) -> str:
        if self.kind != "separated":
            return self.kind
        return (
            f"separated (backends on CPUs {format_cpus(self.backend_cpus or frozenset())}, "
            f"trainer on {format_cpus(self.trainer_cpus or frozenset())})"
        )


def pinned_argv(argv: list[str], cpus: frozenset[int] | None) -> list[str]:
    """`argv` started on `cpus` only: a tiny Python trampoline sets the affinity, then execs, so
    the process and every child it spawns (vLLM's engine cores) inherit the mask from birth."""
    if cpus is None:
        return argv
    mask = ", ".join(str(c) for c in sorted(cpus))
    trampoline = (
        f"import os, sys; os.sched_setaffinity(0, {{{mask}}}); os.execvp(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", trampoline, *argv]
