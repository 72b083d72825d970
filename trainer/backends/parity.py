"""Parity probe: served log-probs of a fixed token sequence vs a reference forward pass.

The probe scores every token of a fixed sequence (log p(t_i | t_<i), i >= 1) and the greedy next
token, on the served model (vLLM `/v1/completions` with `prompt_logprobs`) and on the reference
weights (transformers, fp32). After a weight swap they must agree within a tolerance (1e-4 in fp32)
before the backend may serve again.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import torch

# A fixed probe: plain ASCII, so its token ids are its bytes under the byte-level tokenizer and
# simply ids under any other (a probe is ids, never re-tokenized text).
PROBE_TOKEN_IDS: tuple[int, ...] = tuple(b"The quick brown fox jumps over the lazy dog. 0123456789")


@dataclass(frozen=True)
class ProbeScores:
    """log p(t_i | t_<i) for i = 1..n-1, then the greedy next token and its log-prob."""

    token_logprobs: tuple[float, ...]
    next_token: int
    next_logprob: float

    def max_abs_diff(self, other: ProbeScores) -> float:
        if len(self.token_logprobs) != len(other.token_logprobs):
            return float("inf")
        diffs = [abs(a - b) for a, b in zip(self.token_logprobs, other.token_logprobs, strict=True)]
        diffs.append(abs(self.next_logprob - other.next_logprob))
        return max(diffs)


@torch.no_grad()
def reference_scores(
    model: torch.nn.Module, token_ids: tuple[int, ...] = PROBE_TOKEN_IDS
) -> ProbeScores:
    ids = torch.tensor([token_ids])  # (1, T)
    logits = model(input_ids=ids).logits.float()  # (1, T, V)
    logprobs = torch.log_softmax(logits[0], dim=-1)  # (T, V)
    scored = logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0]  # (T-1,)
    next_token = int(logprobs[-1].argmax())
    return ProbeScores(tuple(scored.tolist()), next_token, float(logprobs[-1, next_token]))


def served_scores(
    http: httpx.Client, url: str, model: str, token_ids: tuple[int, ...] = PROBE_TOKEN_IDS
) -> ProbeScores:
    reply = http.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": list(token_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": 0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        },
    )
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    prompt_logprobs = choice["prompt_logprobs"][1:]  # the first token has no context
    scored = tuple(
        entry[str(tok)]["logprob"]
        for entry, tok in zip(prompt_logprobs, token_ids[1:], strict=True)
    )
    return ProbeScores(
        scored, int(choice["token_ids"][0]), float(choice["logprobs"]["token_logprobs"][0])
    )
