"""What saving the AdamW moments costs after each version: the slot writer
(trainer/loop/optimizer_state.py: raw bytes in place, an index replaced atomically) against the
single file of earlier releases (`torch.save` to a new file, the latest renamed over the previous,
which unlinks it).

    .venv/bin/python bench/moments_save.py            # a 135M model's moments (1.08 GB), 4 saves
    .venv/bin/python bench/moments_save.py --busy     # beside two threads of matmuls (generation)

The state is an AdamW state_dict of the default model's size (SmolLM2-135M: 134.5M parameters,
two fp32 moments each, in tensors of its layers' sizes), saved `--saves` times each way into a
temporary folder on the project's disk; the wall and CPU seconds of each save are reported (the
first save of each way is a warm-up). `--busy` runs a process doing fp32 matmuls on both cores
meanwhile, as vLLM generates beside a colocated trainer's save. The last line is the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.loop.optimizer_state import save_state  # noqa: E402

# SmolLM2-135M: a tied 49152 x 576 embedding, 30 layers of attention (576 x 576 q and o, 576 x 192
# k and v), MLP (3 of 576 x 1536) and two norms, and the final norm.
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
BUSY = (
    "import torch\ntorch.set_num_threads(2)\n"
    "a, b = torch.randn(256, 576), torch.randn(576, 1536)\nwhile True: a @ b"
)


def adamw_state() -> dict:
    shapes = [(49152, 576)] + [s for _ in range(30) for s in [*LAYER, (576,), (576,)]] + [(576,)]
    state = {
        i: {"step": torch.tensor(12.0), "exp_avg": torch.randn(s), "exp_avg_sq": torch.rand(s)}
        for i, s in enumerate(shapes)
    }
    groups = [{"lr": 1e-5, "betas": (0.9, 0.999), "params": list(range(len(shapes)))}]
    return {"state": state, "param_groups": groups}


def single_file(state: dict, path: Path, version: int) -> None:
    """Earlier releases' save: torch.save to a partial file, the latest renamed to previous."""
    partial = path.with_suffix(".partial")
    torch.save({"version": version, "keyed_by": "index", "state": state}, partial)
    if path.exists():
        os.replace(path, path.with_name("optimizer.previous.pt"))
    os.replace(partial, path)


def timed(save, state: dict, folder: Path, saves: int) -> dict:
    path = folder / "optimizer.pt"
    walls, cpus = [], []
    for version in range(saves + 1):
        wall, cpu = time.perf_counter(), time.process_time()
        save(state, path, version)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "wall_s": [round(w, 2) for w in walls[1:]],
        "cpu_s": [round(c, 2) for c in cpus[1:]],
        "median_wall_s": round(statistics.median(walls[1:]), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--busy", action="store_true", help="two threads of matmuls meanwhile")
    p.add_argument("--dir", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    state = adamw_state()
    size = sum(t.nbytes for e in state["state"].values() for t in e.values())
    busy = subprocess.Popen([sys.executable, "-c", BUSY]) if args.busy else None
    started = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
        results = {}
        for name, save in (("single_file", single_file), ("slots", save_state)):
            with tempfile.TemporaryDirectory(dir=args.dir) as folder:
                results[name] = timed(save, state, Path(folder), args.saves)
            print(f"{name}: {results[name]}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
    print(
        json.dumps(
            {
                "bench": "moments_save",
                "date": started,
                "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
                "bytes": size,
                "busy": args.busy,
                **results,
            }
        )
    )


if __name__ == "__main__":
    main()
