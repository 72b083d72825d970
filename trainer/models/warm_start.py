"""Supervised warm start for the `rlgw demo` policy (trainer/models/demo_task.py), trained in place.

`warm_start(model_dir, seed=...)` loads the checkpoint written by `create_model`, trains it
(fp32, AdamW) on TRAIN-split examples rendered with the model's own chat template, with the loss
on the assistant tokens only (the answer and its closing `<|im_end|>`, so the model learns to
stop), and saves it back with `save_pretrained(safe_serialization=True)`; the tokenizer files are
left as they are and `rlgw_model.json` gets the new fingerprint and the recipe.

The recipe (WARM_START) is chosen so that the result is a deliberately imperfect policy that
online RL improves quickly and reliably:

* label smoothing 0.3 keeps ~30% of the probability mass off the right token, so the greedy
  answer is already right (held-out greedy reward ~1.0) but temperature-1 samples, what the demo
  serves, score ~0.35-0.45 on held-out prompts; online RL then sharpens the policy (+0.3 within
  5-20 updates of 32-64 samples in a pure-torch simulation). Smoothing also makes the copying
  circuit form early: ~110-155 steps for 8 of 10 init seeds (without it, 100 to 500+);
* an attempt stops once the moving average of the plain (unsmoothed) NLL of the assistant
  tokens drops below `stop_nll` (0.45; the smoothed optimum is ~0.355), i.e. just after the
  circuit has formed. About 1 init in 5 stays on the plateau (NLL ~2.9) for hundreds of steps
  whatever the data or lr; if an attempt has not converged after `steps` steps the weights are
  redrawn (deterministically from the seed) and training restarts, `restarts` times at most.

Measured on this 2-core machine (1 torch thread, others' jobs running): ~11-14 s for one
attempt (~75 ms a step), ~35 s with one restart; the same seed gives bit-identical weights.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer.models import demo_task
from trainer.models.demo_task import HELD_OUT_SPLIT, TRAIN_SPLIT, Prompt

# The recipe `rlgw init-model --preset demo` uses: a `preset` model from `create_model`, then
# warm_start(**{k: v for k, v in WARM_START.items() if k != "preset"}).
WARM_START: dict[str, Any] = dict(
    preset="tiny",
    steps=250,  # per attempt, an upper bound: training normally stops at ~110-160 (stop_nll)
    lr=3e-3,
    batch_size=128,
    label_smoothing=0.3,
    stop_nll=0.45,
    restarts=2,  # redraw the init if an attempt has not reached stop_nll after `steps`
    warmup_steps=20,
    grad_clip=1.0,
    weight_decay=0.0,
)

IGNORE_INDEX = -100
_EMA = 0.8  # weight of the history in the NLL moving average that stop_nll is compared with


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """The token ids the server sees for each prompt: chat template + generation prompt."""
    enc = tokenizer.apply_chat_template(
        [p.messages for p in prompts], tokenize=True, add_generation_prompt=True
    )
    return [list(ids) for ids in enc["input_ids"]]


def encode_examples(tokenizer, prompts: Sequence[Prompt]):
    """(input_ids, labels, attention_mask), right-padded; labels only on the assistant turn.

    The labelled tokens are the answer and the first `<|im_end|>` after it; the newline the
    template writes after `<|im_end|>` is not part of a completion and is not trained.
    """
    import torch

    prompt_ids = encode_prompts(tokenizer, prompts)
    convs = [p.messages + [{"role": "assistant", "content": p.target}] for p in prompts]
    full_ids = tokenizer.apply_chat_template(convs, tokenize=True)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows, labels = [], []
    for prompt, full in zip(prompt_ids, full_ids, strict=True):
        full = list(full)
        if full[: len(prompt)] != prompt:
            raise ValueError("the chat template does not extend the generation prompt")
        answer = full[len(prompt) :]
        if eos not in answer:
            raise ValueError("the chat template does not close the assistant turn")
        answer = answer[: answer.index(eos) + 1]
        rows.append(prompt + answer)
        labels.append([IGNORE_INDEX] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    label_ids = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(zip(rows, labels, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        label_ids[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return input_ids, label_ids, mask


def batch_prompts(seed: int, attempt: int, step: int, batch_size: int) -> list[Prompt]:
    """The TRAIN-split prompts of one warm-start step (never a held-out prompt)."""
    return demo_task.make_prompts(f"warm_start/{seed}/{attempt}/{step}", batch_size, TRAIN_SPLIT)


def restart_init_seed(seed: int, attempt: int) -> int:
    """The init seed of restart `attempt` (>= 1); attempt 0 keeps the checkpoint's weights."""
    return seed + 1_000_003 * attempt


def _reinitialise(model, init_seed: int) -> None:
    """Redraw the weights exactly as create_model would for `init_seed`."""
    from trainer.models.byte_model import ModelShape, build_model

    cfg = model.config
    shape = ModelShape(
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
    )
    model.load_state_dict(build_model(shape, init_seed).state_dict())


def warm_start(
    model_dir: Path | str,
    *,
    seed: int = 0,
    steps: int = WARM_START["steps"],
    lr: float = WARM_START["lr"],
    batch_size: int = WARM_START["batch_size"],
    label_smoothing: float = WARM_START["label_smoothing"],
    stop_nll: float | None = WARM_START["stop_nll"],
    restarts: int = WARM_START["restarts"],
    warmup_steps: int = WARM_START["warmup_steps"],
    grad_clip: float | None = WARM_START["grad_clip"],
    weight_decay: float = WARM_START["weight_decay"],
    log_every: int = 25,
    log: Callable[[str], None] | None = None,
    save: bool = True,
) -> dict[str, Any]:
    """Train the checkpoint in `model_dir` in place; returns a summary of the run.

    An attempt runs at most `steps` steps and ends early once the moving average of the
    assistant-token NLL is below `stop_nll` (None: never early). If an attempt ends without
    reaching `stop_nll` (the copying circuit never formed: a few random inits in ten stay on the
    plateau for hundreds of steps whatever the data), the weights are redrawn from
    restart_init_seed(seed, attempt) and training starts again, `restarts` times at most; the
    last attempt is kept whatever its loss.

    Deterministic for a seed on a given machine (data, order, restarts and torch's RNG all
    come from `seed`; torch runs with deterministic algorithms).
    """
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    log = log or (lambda line: print(line, flush=True))
    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    recipe = dict(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        label_smoothing=label_smoothing,
        stop_nll=stop_nll,
        restarts=restarts,
        warmup_steps=warmup_steps,
        grad_clip=grad_clip,
        weight_decay=weight_decay,
    )
    max_attempts = 1 + (restarts if stop_nll is not None else 0)

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    started = time.monotonic()
    total_steps = 0
    try:
        for attempt in range(max_attempts):
            if attempt:
                init_seed = restart_init_seed(seed, attempt)
                log(f"[warm-start] restart {attempt}: weights redrawn from init seed {init_seed}")
                _reinitialise(model, init_seed)
            torch.manual_seed(seed + attempt)
            result = _train(
                model,
                tokenizer,
                seed=seed,
                attempt=attempt,
                log=log,
                log_every=log_every,
                started=started,
                **{k: v for k, v in recipe.items() if k != "restarts"},
            )
            total_steps += result["steps_run"]
            if result["converged"]:
                break
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    seconds = time.monotonic() - started

    summary = dict(
        task=demo_task.TASK_NAME,
        seed=seed,
        attempts=attempt + 1,
        init_seed=restart_init_seed(seed, attempt) if attempt else None,
        total_steps=total_steps,
        seconds=round(seconds, 2),
        **result,
        recipe=recipe,
    )
    model.eval()
    if save:
        _save_in_place(model, model_dir, summary)
        log(f"[warm-start] saved to {model_dir} ({total_steps} steps, {seconds:.1f}s)")
    return summary


def _train(
    model,
    tokenizer,
    *,
    seed,
    attempt,
    steps,
    lr,
    batch_size,
    label_smoothing,
    stop_nll,
    warmup_steps,
    grad_clip,
    weight_decay,
    log,
    log_every,
    started,
) -> dict[str, Any]:
    """One attempt: AdamW on the label-smoothed CE of the assistant tokens."""
    import torch
    import torch.nn.functional as F

    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999)
    )
    ema = None
    loss_value = nll_value = float("nan")
    step = 0
    converged = False
    for step in range(1, steps + 1):
        input_ids, labels, mask = encode_examples(
            tokenizer, batch_prompts(seed, attempt, step, batch_size)
        )
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
        flat_logits = logits.reshape(-1, logits.size(-1)).float()
        flat_labels = labels[:, 1:].reshape(-1)
        nll = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX)
        loss = (
            F.cross_entropy(
                flat_logits, flat_labels, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing
            )
            if label_smoothing
            else nll
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        current_lr = lr * min(1.0, step / warmup_steps) if warmup_steps else lr
        for group in optimizer.param_groups:
            group["lr"] = current_lr
        optimizer.step()

        loss_value, nll_value = loss.item(), nll.item()
        ema = nll_value if ema is None else _EMA * ema + (1 - _EMA) * nll_value
        converged = stop_nll is not None and ema < stop_nll
        if (log_every and step % log_every == 0) or converged or step == steps:
            log(
                f"[warm-start] step {step}/{steps} loss {loss_value:.4f} "
                f"nll {nll_value:.4f} (avg {ema:.4f}) lr {current_lr:.2e} "
                f"{time.monotonic() - started:.1f}s"
            )
        if converged:
            log(f"[warm-start] nll average {ema:.4f} < {stop_nll}: stopping at step {step}")
            break
    if stop_nll is None:
        converged = True
    model.eval()
    return dict(
        steps_run=step,
        converged=converged,
        final_loss=loss_value,
        final_nll=nll_value,
        nll_average=ema,
    )


def _save_in_place(model, model_dir: Path, summary: dict[str, Any]) -> None:
    """save_pretrained into a scratch folder, then move the weights and config over the old ones
    (the tokenizer files stay), and record the new fingerprint in rlgw_model.json."""
    from trainer.models.init_model import model_fingerprint

    scratch = model_dir / ".warm_start.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        model.save_pretrained(scratch, safe_serialization=True)
        new_files = {p.name for p in scratch.iterdir() if p.is_file()}
        for old in model_dir.glob("*.safetensors*"):
            if old.name not in new_files:
                old.unlink()
        old_index = model_dir / "model.safetensors.index.json"
        if old_index.exists() and old_index.name not in new_files:
            old_index.unlink()
        for name in sorted(new_files):
            os.replace(scratch / name, model_dir / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    info_path = model_dir / "rlgw_model.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info["fingerprint"] = model_fingerprint(model_dir)
    info["warm_start"] = summary
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    for path in model_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)


def init_demo_model(
    out_dir: Path | str, *, seed: int = 0, overwrite: bool = False, **overrides: Any
) -> dict[str, Any]:
    """create_model(out_dir, WARM_START['preset'], seed) and warm-start it with the recipe."""
    from trainer.models.init_model import create_model

    recipe = {**WARM_START, **overrides}
    create_model(out_dir, recipe.pop("preset"), seed, overwrite=overwrite)
    return warm_start(out_dir, seed=seed, **recipe)


# ---- local evaluation (pure torch; the demo itself samples through vLLM) --------------------


def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    max_new_tokens: int = demo_task.MAX_NEW_TOKENS,
    generator=None,
) -> list[list[str]]:
    """`samples` completions per prompt (temperature 0: greedy), decoded as the server would
    (special tokens skipped); generation stops at `<|im_end|>` or after max_new_tokens."""
    import torch

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id
    rows = [ids for ids in encode_prompts(tokenizer, prompts) for _ in range(samples)]
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding; RoPE only sees relative positions
        input_ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    tokens = _sample(model, input_ids, mask, eos, pad, temperature, max_new_tokens, generator)
    texts = tokenizer.batch_decode(tokens.tolist(), skip_special_tokens=True)
    return [texts[i * samples : (i + 1) * samples] for i in range(len(prompts))]


def _sample(model, input_ids, mask, eos, pad, temperature, max_new_tokens, generator):
    import torch

    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask, use_cache=True)
        done = torch.zeros(input_ids.size(0), dtype=torch.bool)
        picked = []
        for _ in range(max_new_tokens):
            logits = out.logits[:, -1].float()
            if temperature <= 0:
                nxt = logits.argmax(-1)
            else:
                probs = torch.softmax(logits / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            picked.append(nxt)
            done |= nxt == eos
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            out = model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return torch.stack(picked, 1)


def evaluate(
    model_or_dir,
    *,
    split: str = HELD_OUT_SPLIT,
    n: int = 128,
    temperature: float = 1.0,
    samples: int = 4,
    seed: int = 0,
    prompt_seed: int | str = 0,
) -> float:
    """Mean reward of sampled completions on `n` prompts of `split` (default: held out)."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    if isinstance(model_or_dir, str | Path):
        tokenizer = AutoTokenizer.from_pretrained(model_or_dir)
        model = Qwen2ForCausalLM.from_pretrained(model_or_dir, dtype=torch.float32).eval()
    else:
        model, tokenizer = model_or_dir
    prompts = demo_task.make_prompts(prompt_seed, n, split)
    gen = torch.Generator().manual_seed(seed)
    if temperature <= 0:
        samples = 1
    texts = sample_completions(
        model, tokenizer, prompts, temperature=temperature, samples=samples, generator=gen
    )
    scores = [
        demo_task.reward(p, t) for p, group in zip(prompts, texts, strict=True) for t in group
    ]
    return sum(scores) / len(scores)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=WARM_START["steps"])
    parser.add_argument("--lr", type=float, default=WARM_START["lr"])
    parser.add_argument("--create", action="store_true", help="create the model dir first")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--eval", action="store_true", help="print held-out rewards after")
    args = parser.parse_args(argv)
    if args.create:
        init_demo_model(
            args.model_dir, seed=args.seed, overwrite=args.overwrite, steps=args.steps, lr=args.lr
        )
    else:
        warm_start(args.model_dir, seed=args.seed, steps=args.steps, lr=args.lr)
    if args.eval:
        greedy = evaluate(args.model_dir, temperature=0.0)
        sampled = evaluate(args.model_dir, temperature=1.0, samples=4)
        print(f"[warm-start] held-out reward: greedy {greedy:.3f}, temperature 1 {sampled:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
