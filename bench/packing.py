"""Packed against padded micro-batches on the real default model: padding and seconds per update.

SmolLM2-135M-Instruct (fp32, sdpa) on the CPU: `--samples` samples of agent-like lengths (prompts
of 64-384 tokens, answers log-normal around 80 tokens, 4-1024; random ids: the cost does not
depend on them), the same samples every step; `policy_update` padded (`packing="off"`), packed
(`"on"`, no shared prefixes) and packed with shared prefixes (`"shared"`), interleaved step by
step after one warm-up step of each (one model and one AdamW for all, lr 1e-9: the weights barely
move), so that a shared machine's load falls on all alike. `--group N`: every N samples answer
one prompt (a group, as the learning benchmark's tasks); `--prompts` and `--answer-median` set
the lengths.

    .venv/bin/python bench/packing.py [--samples 16] [--steps 2] [--budget 8192]
    .venv/bin/python bench/packing.py --samples 32 --group 8 --prompts 50-70 --answer-median 20

Prints a markdown table; JSON goes to bench/results/packing.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop.device import prepare_model  # noqa: E402
from trainer.loop.microbatch import pack_microbatches  # noqa: E402
from trainer.loop.packing import pack_units, padding_fraction, shared_units  # noqa: E402
from trainer.loop.prefix_sharing import attention_weight  # noqa: E402
from trainer.loop.samples import Sample, Unit, collate_units, row_tokens, sequence_rows  # noqa: E402
from trainer.loop.update import batch_logprobs, plan_update, policy_update  # noqa: E402

MODEL = Path.home() / ".cache" / "rlgw" / "models" / "smollm2-135m-instruct-0.1.2"
RESULTS = ROOT / "bench" / "results" / "packing.json"


def agent_samples(
    n: int,
    vocab: int,
    seed: int,
    group: int = 1,
    prompts: tuple[int, int] = (64, 384),
    answer_median: int = 80,
) -> list[Sample]:
    """n samples: prompts uniform in 64-384 tokens (`prompts`), a new one every `group` samples,
    answers log-normal (median 80, sigma 1) clipped to 4-1024, advantages +-1, behaviour
    log-probs near a uniform policy's."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    prompt: list[int] = []
    for i in range(n):
        if i % group == 0:
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(*prompts))]
        length = min(max(int(rng.lognormvariate(math.log(answer_median), 1.0)), 4), 1024)
        output = [rng.randrange(vocab) for _ in range(length)]
        behave = [-math.log(vocab)] * length
        samples.append(Sample("s", f"c{i}", prompt, output, behave, (-1.0) ** i, 0))
    return samples


def layout(samples: list[Sample], config: TrainerConfig, pad_id: int, share: float | None) -> dict:
    """The micro-batches the update builds: how many, their tokens and their padding."""
    packed = config.packing == "on"
    (batches,) = plan_update(
        samples, config, pad_id, torch.device("cpu"), packed=packed, share=share
    ).microbatches
    return {
        "microbatches": len(batches),
        "tokens_through_model": sum(b.attention.numel() for b in batches),
        "real_tokens": sum(int(b.attention.sum()) for b in batches),
        "padding_frac": padding_fraction(batches),
    }


def layout_logprobs(model, lines_groups: list[list[list[Unit]]], pad_id: int) -> dict:
    """Each sample's log-probs at its output targets, over micro-batches of lines of units."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for lines in lines_groups:
            logp = batch_logprobs(model, collate_units(lines, pad_id))  # (B, L-1)
            for i, line in enumerate(lines):
                at = 0
                for unit in line:
                    at += unit.shared
                    for row in unit.rows:
                        start = at - unit.shared  # where the row's token 0 would lie
                        for s in row:
                            p = start + len(s.prompt_ids)
                            out[s.completion_id] = logp[i, p - 1 : p - 1 + len(s.output_ids)]
                        at += len(row_tokens(row)) - unit.shared
    return out


def logprob_gaps(model, samples: list[Sample], budget: int, pad_id: int, alpha: float) -> dict:
    """The largest |log p - log p padded| over every output token (no gradient), packed and
    packed with shared prefixes."""
    rows = [Unit([row]) for row in sequence_rows(samples)]
    layouts = {
        "off": [
            [[Unit([r])] for r in sequence_rows(g)] for g in pack_microbatches(samples, budget)
        ],
        "on": pack_units(rows, budget),
        "shared": pack_units(shared_units(samples, budget, alpha), budget),
    }
    found = {name: layout_logprobs(model, groups, pad_id) for name, groups in layouts.items()}
    padded = found["off"]
    return {
        name: max(float((found[name][k] - padded[k]).abs().max()) for k in padded)
        for name in ("on", "shared")
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--steps", type=int, default=2, help="timed updates per layout")
    p.add_argument("--budget", type=int, default=8192, help="max_tokens_per_microbatch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--group", type=int, default=1, help="samples per prompt (default 1)")
    p.add_argument("--prompts", default="64-384", help="prompt tokens, MIN-MAX")
    p.add_argument("--answer-median", type=int, default=80, help="answer tokens, median")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--layout-only", action="store_true", help="the micro-batches, no update")
    p.add_argument("--check", action="store_true", help="also the log-prob gaps to the padded path")
    args = p.parse_args(argv)
    from transformers import AutoConfig, AutoModelForCausalLM

    started = datetime.now(UTC)
    model_config = AutoConfig.from_pretrained(str(args.model))
    pad_id = int(model_config.pad_token_id or model_config.eos_token_id or 0)
    low, high = (int(x) for x in args.prompts.split("-"))
    samples = agent_samples(
        args.samples,
        model_config.vocab_size,
        args.seed,
        args.group,
        (low, high),
        args.answer_median,
    )
    configs = {
        name: TrainerConfig(
            device="cpu",
            max_tokens_per_sample=2048,
            max_tokens_per_microbatch=args.budget,
            packing=packing,
            share_prefixes=share,
        )
        for name, packing, share in (
            ("off", "off", False),
            ("on", "on", False),
            ("shared", "on", True),
        )
    }
    alpha = attention_weight(model_config)
    results = {
        k: {**layout(samples, c, pad_id, alpha if c.share_prefixes else None), "update_s": []}
        for k, c in configs.items()
    }
    if args.layout_only:
        print(json.dumps(results, indent=2))
        return 0
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    model = prepare_model(model, configs["off"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9)
    gap = logprob_gaps(model.eval(), samples, args.budget, pad_id, alpha) if args.check else None
    for name, value in (gap or {}).items():
        print(f"largest |log p {name} - log p padded| over output tokens: {value:.2e}", flush=True)
    for step in range(args.steps + 1):  # step 0: warm-up (allocation, AdamW state), not timed
        for packing, config in configs.items():
            start = time.perf_counter()
            policy_update(model, optimizer, samples, config, pad_id)
            if step:
                results[packing]["update_s"].append(time.perf_counter() - start)
                print(
                    f"{packing} step {step}: {results[packing]['update_s'][-1]:.1f} s", flush=True
                )
    rows = [
        "| packing | micro-batches | tokens through the model | real tokens | padding "
        "| update s (mean) | (fastest) |",
        "|---|---|---|---|---|---|---|",
    ]
    for packing, r in results.items():
        r["update_s_mean"] = sum(r["update_s"]) / len(r["update_s"])
        rows.append(
            f"| {packing} | {r['microbatches']} | {r['tokens_through_model']:,} "
            f"| {r['real_tokens']:,} | {r['padding_frac']:.1%} | {r['update_s_mean']:.1f} "
            f"| {min(r['update_s']):.1f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "ended": datetime.now(UTC).isoformat(),
                "machine": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "argv": sys.argv[1:],
                "logprob_gap": gap,
                "results": results,
            },
            indent=2,
        )
    )
    print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
