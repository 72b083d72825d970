"""The trainer's real update path on a GPU: tokens/s, MFU, peak memory and version-write cost.

For the GPU box we borrow now and then (torch, transformers, peft; no vLLM, no Postgres, no
network): the default model's architecture and size (SmolLM2-135M-Instruct, LlamaForCausalLM,
built from its config: bf16, full weights and LoRA rank 8), then Qwen2-shaped models of 0.5B and
1.5B (Qwen2.5's shapes and 151,936-token vocabulary), all randomly initialised (bench/
gpu_models.py): full weights in fp32 and bf16 (autocast over fp32 master weights), LoRA rank 8
and 64 through peft, activation checkpointing, and FSDP2 over nccl with world size 1.
Each configuration runs `trainer.loop.update.policy_update` on samples built by `build_samples` from
recorded-format trajectories (the export JSON), micro-batched, for a fixed number of steps after
one warm-up step, then writes that version's update as the trainer ships it (a bf16 delta
safetensors file and its sha256, or a LoRA adapter folder) and times it, then runs the raw step
(forward, backward, AdamW; nothing else) on the same micro-batches the same number of times.

    whole_s        = mean update step + the version's write (gather, delta, write, checksum)
    whole_over_raw = raw step s / whole_s   (= whole tokens/s over raw tokens/s; the trainer's
                     claim, probe, commit and push are not in it: no database, no backend here)

    bench/gpu_check.sh                                  # on the GPU box, from the repo root
    python bench/gpu_check.py --device cpu --quick      # tiny shapes, here (the test runs this)

JSON goes to stdout and, when $OUT is set, to $OUT/gpu_check.json; progress goes to stderr.
FLOPs per trained configuration and token (PaLM, Chowdhery et al. 2022, appendix B):
full weights 6 N + 12 L H T, LoRA 4 N + 6 N_lora + 12 L H T (frozen weights need no weight
gradient: 2 N forward + 2 N input gradients), where N counts the weights a token multiplies (the
input embedding is a lookup and is left out unless tied to the LM head), L layers, H = heads x
head_dim, T the sample's length. The proximal forward pass is not model FLOPs (see update.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_models import SIZES, Run, Size, build, lora_wrap, runs_for  # noqa: E402
from bench.weight_transfer_check import transfer_check  # noqa: E402
from rlgw.ports import free_port  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop import distributed  # noqa: E402
from trainer.loop.device import autocast, prepare_model  # noqa: E402
from trainer.loop.loss import token_logprobs  # noqa: E402
from trainer.loop.packing import prefix_sharing, use_packing  # noqa: E402
from trainer.loop.records import trajectory_from_export  # noqa: E402
from trainer.loop.samples import build_samples  # noqa: E402
from trainer.loop.update import batch_logits, plan_update, policy_update  # noqa: E402
from trainer.models.weights import delta, state_dict, write_update  # noqa: E402
from trainer.publishing.versions import file_sha256  # noqa: E402
from trainer.weight_update.lora import WEIGHTS_FILE  # noqa: E402

# Dense peak TFLOP/s of an H100/H200 SXM (NVIDIA's datasheet): bf16 tensor cores 989; plain fp32
# 67 (the fp32 runs keep torch's default: TF32 off, so 494.7 of TF32 tensor cores is not the peak).
PEAKS = {"bfloat16": 989.0, "float32": 67.0}
SIZE_STEP = 3.5  # how much dearer the next size's first run is guessed to be (for --max-seconds)


def log(message: str) -> None:
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data


def recorded_trajectories(size: Size, seed: int) -> list[dict]:
    """Trajectories in the export's wire format (`GET /v1/sessions/{id}/trajectory`), one
    completion each, with behaviour log-probs near a random model's (-log V), rewards +-1."""
    rng = random.Random(seed)
    behave = -math.log(size.vocab)
    out = []
    for i in range(size.samples):
        reward = rng.choice([-1.0, 1.0])
        step = {
            "completion_id": f"c{i}",
            "policy_version": 0,
            "prompt_token_ids": [rng.randrange(size.vocab) for _ in range(size.prompt)],
            "output_token_ids": [rng.randrange(size.vocab) for _ in range(size.output)],
            "output_logprobs": [behave + rng.uniform(-0.3, 0.3) for _ in range(size.output)],
            "eligible": True,
            "eligibility_reason": None,
            "finish_reason": "length",
        }
        out.append(
            {
                "session_id": f"s{i}",
                "return_raw": reward,
                "return_normalized": reward,
                "sibling_normalization": "mean_std",
                "sibling_groups": [],
                "steps": [step],
            }
        )
    return json.loads(json.dumps(out))  # exactly what a file of exported JSON would give


# ----------------------------------------------------------------------------- arithmetic


def matmul_params(model: torch.nn.Module) -> int:
    """Weights a token multiplies: every parameter but an untied input embedding (a lookup)."""
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    return total if tied else total - embed.numel()


def flops_per_step(config, n_matmul: int, run: Run, lengths: list[int], lora_params: int) -> float:
    """Model FLOPs of one update over samples of these lengths (see the module docstring)."""
    heads = config.num_attention_heads
    width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    per_token = 6 * n_matmul if run.mode == "full" else 4 * n_matmul + 6 * lora_params
    attention = sum(12 * config.num_hidden_layers * width * t * t for t in lengths)
    return per_token * sum(lengths) + attention


# ----------------------------------------------------------------------------- one run


def write_version(model, served, run: Run, scratch: Path) -> dict:
    """The version's update as the trainer ships it, timed by phase as the trainer's step names
    them (trainer/loop/phases.py): full weights: gather (the weights, whole, to the CPU), delta
    (theta - theta_served in the trainer's default delta_dtype, bf16), write (the safetensors
    file), checksum (its sha256, as Publisher.record takes it); LoRA: write (peft's
    save_pretrained) and checksum (of the adapter's weights file)."""
    clock, phases = time.perf_counter(), {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now

    if run.mode == "lora":
        folder = scratch / "adapter"
        model.save_pretrained(folder)
        lap("write")
        file_sha256(folder / WEIGHTS_FILE)
        lap("checksum")
        size = sum(f.stat().st_size for f in folder.iterdir())
        kind = "lora adapter folder"
    else:
        weights = distributed.gather_full_state(model) if run.fsdp else cpu_weights(model)
        lap("gather")
        dtype = getattr(torch, TrainerConfig().delta_dtype)
        tensors = delta(weights, served, dtype)
        lap("delta")
        size = write_update(tensors, scratch / "delta.safetensors")
        lap("write")
        file_sha256(scratch / "delta.safetensors")
        lap("checksum")
        kind = f"delta safetensors ({dtype})".replace("torch.", "")
    return {"kind": kind, "bytes": size, "seconds": sum(phases.values()), "phases": phases}


def cpu_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights, whole, fp32 on the CPU: what the trainer's reference holds after a step."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state_dict(model).items()}


def raw_step(model, optimizer, batches: list, dtype: str, device: torch.device) -> None:
    """The arithmetic floor (bench/trainer_throughput.py's raw step, over the update's own
    micro-batches): forward and backward of the plain log-likelihood of the trained tokens, then
    one AdamW step. No proximal pass, no PPO loss, no clip, no metrics."""
    tokens = sum(float(b.mask.sum()) for b in batches)
    for batch in batches:
        with autocast(device, dtype):
            logits = batch_logits(model, batch)  # (B, L, V): padded or packed, as laid out
        logp = token_logprobs(logits[:, :-1], batch.targets)  # (B, L-1)
        loss = -(logp * batch.mask).sum() / max(tokens, 1.0)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(run: Run, device: torch.device, seed: int, scratch: Path) -> dict:
    size = run.size
    config = TrainerConfig(
        device=device.type,
        dtype=run.dtype,
        max_tokens_per_sample=size.prompt + size.output,
        max_tokens_per_microbatch=size.microbatch,
        gradient_checkpointing=run.checkpointing,
        lr=1e-5,
    )
    samples, skips = build_samples(
        [trajectory_from_export(t) for t in recorded_trajectories(size, seed)],
        current_version=0,
        config=config,
    )
    assert samples and not skips, skips
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build(run, device, seed)
    total_params = sum(p.numel() for p in model.parameters())
    n_matmul, model_config = matmul_params(model), model.config
    if run.mode == "lora":
        model = lora_wrap(model, run.lora_rank)
    model = prepare_model(model, config, device)
    if run.fsdp:
        model = distributed.shard_model(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    lora_params = sum(p.numel() for p in trainable) if run.mode == "lora" else 0
    served = None  # theta_served, to make the delta from: as trainer/loop/service.py keeps it
    if run.fsdp:
        served = distributed.gather_full_state(model)
    elif run.mode == "full":  # rank 0's CPU reference (trainer/loop/policy.py)
        served = cpu_weights(model)
    # The service's optimizer: AdamW over the trainable parameters, torch's default kernels.
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=config.betas)
    # the update's own layout: packed where `packing` (auto: where it is faster) says so
    packed, share = use_packing(config, model), prefix_sharing(config, model)
    plan = plan_update(samples, config, size.vocab - 1, device, packed=packed, share=share)
    lengths = [len(s.prompt_ids) + len(s.output_ids) for s in samples]
    flops = flops_per_step(model_config, n_matmul, run, lengths, lora_params)

    times, metrics = [], {}
    for step in range(size.steps + 1):  # step 0 is the warm-up: allocation, autotuning
        sync(device)
        start = time.perf_counter()
        metrics = policy_update(model, optimizer, samples, config, pad_id=size.vocab - 1)
        sync(device)
        if step:
            times.append(time.perf_counter() - start)
    step_s = sum(times) / len(times)
    write = write_version(model, served, run, scratch)
    raw_times = []
    for step in range(size.steps + 1):  # after the version's write: the delta is the update's
        sync(device)
        start = time.perf_counter()
        raw_step(model, optimizer, plan.microbatches[0], run.dtype, device)
        sync(device)
        if step:
            raw_times.append(time.perf_counter() - start)
    raw_s = sum(raw_times) / len(raw_times)
    whole_s = step_s + write["seconds"]
    peak = PEAKS[run.dtype] if device.type == "cuda" and is_h100_class(device) else None
    achieved = flops / step_s / 1e12
    return {
        "name": run.name,
        "model": size.name,
        "mode": run.mode,
        "lora_rank": run.lora_rank or None,
        "dtype": run.dtype,
        "fsdp2": run.fsdp,
        "gradient_checkpointing": run.checkpointing,
        "params": total_params,
        "trainable_params": sum(p.numel() for p in trainable),
        "samples_per_step": len(samples),
        "tokens_per_step": sum(lengths),
        "output_tokens_per_step": int(metrics["tokens"]),
        "microbatches_per_step": len(plan.microbatches[0]),
        "packed": packed,
        "padding_frac": plan.padding,
        "max_tokens_per_microbatch": size.microbatch,
        "steps_measured": len(times),
        "step_s": times,
        "tokens_per_s": sum(lengths) / step_s,
        "model_tflop_per_step": flops / 1e12,
        "achieved_tflop_per_s": achieved,
        "peak_tflop_per_s": peak,
        "mfu": achieved / peak if peak else None,
        "peak_memory_gib": peak_memory_gib(device),
        "version_write": write,
        "raw_step_s": raw_times,
        "raw_tokens_per_s": sum(lengths) / raw_s,
        "whole_s": whole_s,
        "whole_over_raw": raw_s / whole_s,
        "metrics": {k: metrics[k] for k in ("loss", "grad_norm", "kl_behave", "ratio_mean")},
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_h100_class(device: torch.device) -> bool:
    name = torch.cuda.get_device_name(device)
    return any(k in name for k in ("H100", "H200", "H800", "GH200"))


def peak_memory_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


# ----------------------------------------------------------------------------- the run


def run_one(run: Run, device: torch.device, seed: int) -> dict:
    """One configuration in its own scratch folder (and, for FSDP2, its own process group)."""
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if run.fsdp:  # world size 1, in this process: what torchrun would set
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        distributed.init_distributed(device.type)
    try:
        return measure(run, device, seed, scratch)
    except Exception as exc:  # noqa: BLE001 - one failed configuration must not stop the rest
        return {"name": run.name, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if run.fsdp:
            distributed.shutdown_distributed()
        shutil.rmtree(scratch, ignore_errors=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one measured step")
    parser.add_argument(
        "--sizes", default="smollm2,0.5b,1.5b", help="comma-separated: smollm2, 0.5b, 1.5b"
    )
    parser.add_argument("--max-seconds", type=float, default=420.0, help="skip what would pass it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device (use --device cpu --quick)")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    quick = [SIZES["quick"], SIZES["quick-llama"]]
    sizes = quick if args.quick else [SIZES[s.strip()] for s in args.sizes.split(",")]
    started = time.perf_counter()
    report = environment(device) | {"max_seconds": args.max_seconds, "quick": args.quick}
    results, skipped, took = [], [], {}  # took: size name -> longest run of that size, s
    for run in [r for size in sizes for r in runs_for(size)]:
        elapsed = time.perf_counter() - started
        # A run costs about the dearest of its size so far; a first run of a larger size about
        # SIZE_STEP times the dearest run before it (1.5B / 0.5B parameters ~ 3.1).
        estimate = took.get(run.size.name, max(took.values(), default=0.0) * SIZE_STEP)
        if elapsed + estimate > args.max_seconds:
            reason = (
                f"--max-seconds {args.max_seconds:.0f}: {elapsed:.0f} s spent and this run "
                f"would take about {estimate:.0f} s"
            )
            skipped.append({"name": run.name, "reason": reason})
            log(f"skip {run.name}: {reason}")
            continue
        log(f"run {run.name}")
        t0 = time.perf_counter()
        results.append(run_one(run, device, args.seed))
        seconds = time.perf_counter() - t0
        took[run.size.name] = max(took.get(run.size.name, 0.0), seconds)
        log(summary_line(results[-1], seconds))
    log("weight transfer: pack, broadcast over a one-process group, unpack")
    transfer = weight_transfer(device, "quick" if args.quick else "0.5b")
    report |= {
        "total_s": time.perf_counter() - started,
        "results": results,
        "skipped": skipped,
        "weight_transfer": transfer,
    }
    emit(report)
    failed = any("error" in r for r in results) or not transfer.get("bitwise_equal")
    return 1 if failed else 0


def weight_transfer(device: torch.device, size: str) -> dict:
    """The trainer's half of NcclTransfer (bench/weight_transfer_check.py), or its error."""
    try:
        return transfer_check(device, size)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON like a failed configuration
        return {"error": f"{type(exc).__name__}: {exc}"}


def environment(device: torch.device) -> dict:
    import transformers

    try:
        import peft

        peft_version = peft.__version__
    except ImportError:
        peft_version = None
    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft_version,
        "peak_tflop_per_s": PEAKS,
        "flops_formula": "full: 6N + 12LHT per token; lora: 4N + 6N_lora + 12LHT (PaLM app. B)",
    }


def summary_line(result: dict, seconds: float) -> str:
    if "error" in result:
        return f"  {result['name']}: ERROR {result['error']}"
    mfu = f"{result['mfu']:.1%}" if result["mfu"] is not None else "n/a"
    write = result["version_write"]
    return (
        f"  {result['name']}: {result['tokens_per_s']:,.0f} tok/s, MFU {mfu}, peak "
        f"{result['peak_memory_gib'] or 0:.1f} GiB, write {write['bytes'] / 1e6:.1f} MB "
        f"in {write['seconds']:.2f} s, whole/raw {result['whole_over_raw']:.0%} "
        f"({seconds:.0f} s in all)"
    )


def emit(report: dict) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "gpu_check.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        log(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
