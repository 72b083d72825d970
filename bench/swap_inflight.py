"""A weight swap while a 400-token answer is in flight: how long the backend is out of service, and
what becomes of the answer (its client's wait, its record: complete? trained on? which versions?).

    .venv/bin/python bench/swap_inflight.py                 # the real default model, 3 swaps
    .venv/bin/python bench/swap_inflight.py --preset tiny --repeats 1   # plumbing

The whole stack: a vLLM CPU server of the model (`rlgw backend`'s launcher), `rlgw serve` on a
fresh Postgres database, the official openai client. Each repeat streams one answer of 400
tokens at temperature 1 (`ignore_eos`), and as soon as its first token arrives pushes a delta
(`rlgw push`'s code: a small random change of one MLP matrix, so that the versions differ and the
model stays itself) to the backend. Reported per swap: the backend's time out of routing and
paused (the coordinator's report), the answer's wall time, its record's status, eligibility and
per-token versions. Run it on the code before the pause-in-place swap (a worktree at that commit)
for the "before" column. The last line printed is the JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import openai  # noqa: E402
import torch  # noqa: E402

from bench.multiturn import model_path  # noqa: E402
from bench.processes import log  # noqa: E402
from bench.rlgw_process import RlgwServer  # noqa: E402
from rlgw.swap_boundaries import runs  # noqa: E402

MODEL_NAME = "inflight"
CHANGED = "model.layers.0.mlp.down_proj.weight"  # the one matrix each delta changes


def small_delta(path: Path, seed: int, out: Path) -> Path:
    """A delta file changing one matrix by a little noise (every served log-prob moves)."""
    from safetensors import safe_open

    from trainer.models.weights import write_update

    with safe_open(str(next(path.glob("*.safetensors"))), "pt") as f:
        shape = f.get_slice(CHANGED).get_shape()
    generator = torch.Generator().manual_seed(seed)
    delta = {CHANGED: torch.randn(shape, generator=generator) * 2e-3}
    target = out / f"delta-{seed}.safetensors"
    write_update(delta, target)
    return target


def one_swap(gw: RlgwServer, settings, model_dir: Path, seed: int, out: Path, tokens: int) -> dict:
    from trainer.publishing.push import push

    delta = small_delta(model_dir, seed, out)
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    started, first, done = time.perf_counter(), threading.Event(), {}

    def answer() -> None:
        try:
            ids, finish = set(), None
            for chunk in client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "Tell me about the history of tea."}],
                max_tokens=tokens,
                temperature=1.0,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                ids.add(chunk.id)
                first.set()
                finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            done.update(ids=sorted(ids), finish=finish)
        except Exception as exc:  # reported
            done.update(error=repr(exc))
        finally:
            first.set()
            done["answer_s"] = time.perf_counter() - started

    thread = threading.Thread(target=answer)
    thread.start()
    first.wait(600)
    (report,) = push(settings, settings.database_url, MODEL_NAME, delta=delta)
    thread.join(900)
    admin = httpx.Client(
        base_url=gw.url, headers={"X-Admin-Key": gw.admin_key}, timeout=60, trust_env=False
    )
    record = admin.get(f"/admin/completions/{done['ids'][0]}").json() if done.get("ids") else {}
    versions = record.get("output_versions") or []
    tokens = {
        "prompt": record.get("prompt_token_ids") or [],
        "output": record.get("output_token_ids") or [],
        "logprobs": record.get("output_logprobs") or [],
        "versions": versions
        or [record.get("policy_version")] * len(record.get("output_token_ids") or ()),
    }
    return {
        "_tokens": tokens,
        "outcome": report.outcome,
        "out_of_routing_s": report.out_of_routing_s,
        "paused_s": report.paused_s,
        "steps": report.steps,
        "held": getattr(report, "held", None),
        "answer_s": done.get("answer_s"),
        "finish": done.get("finish"),
        "error": done.get("error"),
        "status": record.get("status"),
        "output_tokens": len(record.get("output_token_ids") or ()),
        "eligible": record.get("eligible"),
        "eligibility_reason": record.get("eligibility_reason"),
        "versions_runs": runs(versions),
    }


@torch.no_grad()
def mismatch(model_dir: Path, out: Path, rows: list[dict]) -> None:
    """Per swap: max |recorded - reference| of the answer's log-probs, over the tokens each
    version sampled, each scored by a forward pass of that version (transformers, fp32)."""
    from safetensors.torch import load_file

    from trainer.models.weights import apply_delta, load_reference_model

    model = load_reference_model(model_dir).eval()
    models = {0: {k: v.clone() for k, v in model.state_dict().items()}}
    for i in range(len(rows)):  # version i + 1 = version i + delta i
        apply_delta(model, load_file(str(out / f"delta-{i}.safetensors")))
        models[i + 1] = {k: v.clone() for k, v in model.state_dict().items()}
    for row in rows:
        t = row.pop("_tokens")
        if not t["output"]:
            continue
        ids = torch.tensor([t["prompt"] + t["output"]])
        positions = torch.arange(len(t["prompt"]) - 1, len(ids[0]) - 1)
        recorded = torch.tensor(t["logprobs"], dtype=torch.float64)
        per_version = {}
        for version in sorted({v for v in t["versions"] if v is not None}):
            model.load_state_dict(models[version])
            logits = model(input_ids=ids).logits[0].double()
            scored = torch.log_softmax(logits, -1)[positions, torch.tensor(t["output"])]
            at = torch.tensor([v == version for v in t["versions"]])
            per_version[str(version)] = float((recorded - scored)[at].abs().max())
        row["max_abs_logprob_diff_by_version"] = per_version


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="real", choices=["real", "tiny"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, default=400, help="of the answer in flight")
    p.add_argument("--label", default="", help="a name for this code (e.g. before, after)")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    p.add_argument("--out", default="bench/results/swap_inflight")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
    from rlgw.ports import free_port
    from rlgw.settings import Settings

    path = model_path(args.preset, out)
    port = free_port()
    log(f"starting vLLM on {path} (port {port}; minutes on a CPU)")
    backend = start_backend(path, port, served_model_name=MODEL_NAME, log_path=out / "vllm.log")
    rows = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=900, proc=backend)
        with RlgwServer(free_port(), pg=args.pg, log_path=out / "gateway.log") as gw:
            gw.register(MODEL_NAME, f"http://127.0.0.1:{port}", path=path)
            settings = Settings(
                database_url=gw.env["RLGW_DATABASE_URL"],
                home=gw.home,
                admin_key=gw.admin_key,
            )
            for i in range(args.repeats):
                row = one_swap(gw, settings, path, seed=i, out=out, tokens=args.tokens)
                rows.append(row)
                log(
                    f"swap {i + 1}/{args.repeats}: {row['outcome']}, out of routing "
                    f"{row['out_of_routing_s']:.2f} s (paused {row['paused_s']:.3f} s); answer "
                    f"{row['status']} {row['output_tokens']} tokens in {row['answer_s']:.1f} s, "
                    f"eligible {row['eligible']} {row['versions_runs']}"
                )
    finally:
        stop_backend(backend)
    log("scoring each answer's tokens with the version that sampled them (transformers, fp32)")
    mismatch(path, out, rows)
    summary = {
        "bench": "swap_inflight",
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "model": path.name,
        "tokens": args.tokens,
        "out_of_routing_s_median": statistics.median(r["out_of_routing_s"] for r in rows),
        "answers_excluded": sum(not r["eligible"] for r in rows),
        "swaps": rows,
    }
    (out / f"summary{'-' + args.label if args.label else ''}.json").write_text(
        json.dumps(summary, indent=2)
    )
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
