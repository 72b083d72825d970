"""A 10-turn agent session on the real default model: per-turn samples against one sequence.

    .venv/bin/python bench/multiturn.py               # 10 turns, the real default model
    .venv/bin/python bench/multiturn.py --turns 6 --preset tiny --repeats 1   # plumbing

Records one agent session through the gateway (`rlgw serve` on a fresh Postgres database, a real
vLLM CPU server of the model, the official openai client at temperature 1): a system prompt that
offers a calculator, a task, and after each answer the tool's result as the next message, turn
after turn, each request resending the whole conversation. The session is rewarded and read
back from the gateway as the trainer reads it (the trajectory's export), then the trainer's
samples are built both ways from that one record (rlgw/sequences.py): `join_turns=False`, every
turn a sample whose prompt is the whole history (the trainer before), and `join_turns=True`,
the turns one sequence while each prompt extends the last turn's prompt and output. For each:
the rows, the tokens the forward pass reads, the padded rectangle, the trained (loss-bearing)
tokens, the cuts and why, and the wall time of a full-weights update (fp32, AdamW, the trainer's
default configuration otherwise; the best of --repeats). The last line printed is the JSON.

The tool results are user messages ("Calculator result: ..."): SmolLM2-135M-Instruct serves
without a tool parser (rlgw/tool_parsers.py), so OpenAI tool messages, which need the assistant's
parsed tool calls, are not available to this model.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import openai  # noqa: E402
import torch  # noqa: E402

from bench.processes import log  # noqa: E402
from bench.rlgw_process import RlgwServer  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop.records import trajectory_from_export  # noqa: E402
from trainer.loop.samples import build_samples, row_tokens, sequence_rows  # noqa: E402
from trainer.loop.update import policy_update  # noqa: E402

MODEL_NAME = "multiturn"
SYSTEM = (
    "You are a careful assistant with a calculator. To use it, write a line CALC: <expression>. "
    "You will get the result in the next message. Keep each answer short."
)
TASK = "A shop sells pens at 3 dollars and notebooks at 7 dollars. Plan a budget of 100 dollars."


def model_path(preset: str, home: Path) -> Path:
    if preset == "tiny":
        from trainer.models.init_model import create_model

        path = home / "tiny"
        if not (path / "config.json").exists():
            create_model(path, "tiny", overwrite=True)
        return path
    from trainer.models.pretrained import cached_checkpoint

    return cached_checkpoint(log=log)


def record_session(gw: RlgwServer, turns: int, max_tokens: int) -> dict:
    """One session of `turns` turns through the gateway; its trajectory as the export shows it."""
    sid = f"multiturn-{uuid.uuid4().hex[:10]}"
    http = httpx.Client(base_url=gw.url, timeout=600, trust_env=False)
    assert http.post("/v1/sessions", json={"id": sid}).status_code == 201
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for i in range(turns):
        reply = client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=max_tokens,
            temperature=1.0,
            extra_headers={"X-Session-Id": sid},
        )
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": f"Calculator result: {17 * (i + 2)}. Go on."})
        log(f"turn {i + 1}/{turns}: {len(answer)} characters")
    assert http.post(f"/v1/sessions/{sid}/rewards", json={"value": 1.0}).status_code == 201
    assert http.post(f"/v1/sessions/{sid}/close").status_code == 200
    trajectory = http.get(f"/v1/sessions/{sid}/trajectory").json()
    view = http.get(f"/v1/sessions/{sid}/trajectory", params={"view": "training"})
    trajectory["_training_view_cuts"] = (
        [c for s in view.json()["sequences"] for c in s["cuts"]] if view.is_success else None
    )
    return trajectory


def measure(model: torch.nn.Module, trajectory: dict, join: bool, repeats: int) -> dict:
    config = TrainerConfig(
        join_turns=join, max_tokens_per_sample=8192, max_tokens_per_microbatch=8192
    )
    samples, skips = build_samples(
        [trajectory_from_export(trajectory)], current_version=0, config=config
    )
    rows = sequence_rows(samples)
    lengths = [len(row_tokens(r)) for r in rows]
    seconds = []
    for _ in range(repeats):
        trained = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-6)
        t0 = time.perf_counter()
        metrics = policy_update(trained, optimizer, samples, config, pad_id=0)
        seconds.append(time.perf_counter() - t0)
        del trained, optimizer
    return {
        "join_turns": join,
        "samples": len(samples),
        "skipped": [s.reason for s in skips],
        "rows": len(rows),
        "forward_tokens": sum(lengths),
        "padded_tokens": len(rows) * max(lengths, default=0),
        "trained_tokens": int(metrics["tokens"]),
        "update_s": min(seconds),
        "update_s_all": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=64, help="per answer")
    p.add_argument("--preset", default="real", choices=["real", "tiny"])
    p.add_argument("--repeats", type=int, default=2, help="updates timed per way (the best kept)")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    p.add_argument("--out", default="bench/results/multiturn")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
    from rlgw.ports import free_port
    from trainer.models.weights import load_reference_model

    path = model_path(args.preset, out)
    port = free_port()
    log(f"starting vLLM on {path} (port {port}; minutes on a CPU)")
    backend = start_backend(path, port, served_model_name=MODEL_NAME, log_path=out / "vllm.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=900, proc=backend)
        with RlgwServer(free_port(), pg=args.pg, log_path=out / "gateway.log") as gw:
            gw.register(MODEL_NAME, f"http://127.0.0.1:{port}")
            trajectory = record_session(gw, args.turns, args.max_tokens)
    finally:
        stop_backend(backend)
    (out / "trajectory.json").write_text(json.dumps(trajectory))
    log("timing the updates (full weights, fp32, CPU)")
    torch.manual_seed(0)
    model = load_reference_model(path).eval()
    results = [measure(model, trajectory, join, args.repeats) for join in (False, True)]
    per_turn, joined = results
    summary = {
        "bench": "multiturn",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "model": path.name,
        "turns": len(trajectory["steps"]),
        "cuts": trajectory.pop("_training_view_cuts"),
        "per_turn": per_turn,
        "one_sequence": joined,
        "forward_tokens_ratio": per_turn["forward_tokens"] / max(joined["forward_tokens"], 1),
        "update_time_ratio": per_turn["update_s"] / max(joined["update_s"], 1e-9),
    }
    for r in results:
        log(
            f"join_turns={r['join_turns']!s:5}  rows {r['rows']:2d}  forward tokens "
            f"{r['forward_tokens']:6d}  padded {r['padded_tokens']:6d}  trained "
            f"{r['trained_tokens']:5d}  update {r['update_s']:.2f}s"
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
