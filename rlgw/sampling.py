"""The sampling settings a backend applied to a completion, read from the body it was sent.

vLLM (0.32, started by rlgw/backend_launcher.py with `--generation-config vllm`, so a field the
request omits takes vLLM's neutral default, never the model's generation_config.json) turns a chat
or text completion body into SamplingParams with the defaults below. What it applies besides
temperature, top-k, top-p, min-p and min_tokens (the stop tokens masked until then) changes the
distribution in ways the trainer does not reproduce; `sampling_problems` names each
(rlgw/eligibility.py makes them reasons). The order vLLM applies them in, and what the trainer
reproduces: docs/training.md, "Behaviour log-probs and sampling settings".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# vLLM's defaults for a field the request omits or sends as null (`_DEFAULT_SAMPLING_PARAMS` of
# its chat and completions protocols), with `--generation-config vllm`.
DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
# Below this temperature vLLM samples greedily (vllm.v1.sample.sampler._SAMPLING_EPS).
GREEDY_BELOW = 1e-5
# vLLM raises a positive temperature below this to it (vllm.sampling_params._MAX_TEMP), so only
# 0 is greedy.
MIN_TEMPERATURE = 1e-2
# The request fields through which vLLM constrains decoding with a grammar (structured outputs).
_STRUCTURED_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice")
_STRUCTURED_FORMATS = ("json_object", "json_schema", "structural_tag")


def _number(value: Any, default: float) -> Any:
    """The value vLLM would use: the default for null, a number as a float, else as sent (a
    request with a value vLLM refuses never completes, so it is never trained on)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value) if isinstance(default, float) else int(value)
    return value


def _structured_output(body: Mapping[str, Any]) -> str | None:
    """What made vLLM constrain decoding with a grammar, or None. Tool calls are constrained when
    `tool_choice` is "required" or names a function, or when a tool is `strict` (vLLM's tool
    parsers and structural tags; with tool_choice "auto" and no strict tool they are free)."""
    for name in _STRUCTURED_FIELDS:
        if body.get(name) not in (None, {}, []):
            return name
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in _STRUCTURED_FORMATS:
        return f"response_format {fmt['type']}"
    tools = body.get("tools")
    if not tools:
        return None
    choice = body.get("tool_choice")
    if choice == "required":
        return "tool_choice required"
    if isinstance(choice, Mapping):
        return "tool_choice naming a function"
    if choice != "none" and any(
        isinstance(t, Mapping)
        and isinstance(t.get("function"), Mapping)
        and t["function"].get("strict")
        for t in tools
    ):
        return "a strict tool"
    return None


def effective_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling settings vLLM applies to a chat or text completion `body` (the one the
    backend got): each number with vLLM's default filled in, and which other processing is on."""
    out: dict[str, Any] = {name: _number(body.get(name), d) for name, d in DEFAULTS.items()}
    t = out["temperature"]
    if isinstance(t, float) and 0.0 < t < MIN_TEMPERATURE:
        out["temperature"] = MIN_TEMPERATURE  # what vLLM samples at
    min_tokens = body.get("min_tokens")
    out["min_tokens"] = 0 if min_tokens is None else min_tokens
    stop_ids = body.get("stop_token_ids")
    out["stop_token_ids"] = list(stop_ids) if isinstance(stop_ids, list) else []
    out["seed"] = body.get("seed")
    n = body.get("n")
    out["n"] = 1 if n is None else n
    out["logit_bias"] = bool(body.get("logit_bias"))
    out["bad_words"] = bool(body.get("bad_words"))
    out["allowed_token_ids"] = body.get("allowed_token_ids") is not None
    out["structured_output"] = _structured_output(body)
    out["beam_search"] = bool(body.get("use_beam_search"))
    out["thinking_token_budget"] = body.get("thinking_token_budget") is not None
    return out


def is_greedy(sampling: Mapping[str, Any]) -> bool:
    t = sampling.get("temperature", 1.0)
    return isinstance(t, (int, float)) and t < GREEDY_BELOW


def sampling_problems(sampling: Mapping[str, Any] | None) -> list[str]:
    """Why the trainer cannot reproduce the distribution these settings sampled from; empty
    when it can (temperature, top-k, top-p, min-p only). None (recorded before the settings were
    kept) has no problem here: such a completion trains as before, at temperature 1."""
    if sampling is None:
        return []
    problems = []
    if is_greedy(sampling):
        problems.append(
            f"sampled greedily (temperature {sampling['temperature']}): an argmax is not a "
            "sampling distribution the trainer can score"
        )
    for name in ("temperature", "top_p", "top_k", "min_p"):
        if not isinstance(sampling.get(name), (int, float)) or isinstance(sampling[name], bool):
            problems.append(f"{name} {sampling.get(name)!r} is not a number")
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        if sampling.get(name, DEFAULTS[name]) != DEFAULTS[name]:
            problems.append(
                f"sampled with {name} {sampling[name]}: the trainer cannot reproduce it"
            )
    min_tokens = sampling.get("min_tokens") or 0
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool):
        problems.append(f"min_tokens {min_tokens!r} is not an integer")
    elif min_tokens and "stop_token_ids" not in sampling:
        problems.append(
            f"sampled with min_tokens {min_tokens} before the request's stop_token_ids were "
            "recorded: the trainer cannot rebuild the stop-token mask"
        )
    flags = {
        "logit_bias": "a logit_bias",
        "bad_words": "bad_words",
        "allowed_token_ids": "allowed_token_ids",
        "beam_search": "beam search",
        "thinking_token_budget": "a thinking_token_budget",
    }
    for name, text in flags.items():
        if sampling.get(name):
            problems.append(f"sampled with {text}: the trainer cannot reproduce it")
    if sampling.get("structured_output"):
        problems.append(
            f"decoding constrained by structured outputs ({sampling['structured_output']}): "
            "the trainer cannot reproduce the grammar's mask"
        )
    return problems
