"""A session's training sequences: its turns joined into one sequence while the record proves it.

Pure (no torch, no database, no pydantic): the trainer builds its samples with it
(`trainer/loop/samples.py`) and the gateway serves the same sequences as the trajectory's training
view (`GET /v1/sessions/{id}/trajectory?view=training`, `rlgw export --view training`).

An agent resends the whole conversation each turn. When a turn's recorded prompt ids begin with
an earlier turn's prompt ids followed by its output ids (token for token, from the record; nothing
is re-tokenized), the later turn EXTENDS that turn's sequence: one forward pass over the last
turn's prompt and output scores every turn's output, and everything between the outputs (tool
results, user turns, template tokens) is context that carries no loss. Where no earlier sequence
is a prefix of a turn's prompt, the turn begins a new sequence, and the cut's reason says why:

- `branch`: the prompt is an earlier sequence cut at the start of one of its outputs (the other
  choices of a request with n > 1, or a turn regenerated from the same history);
- `output_retokenized`: the prompt departs from an earlier sequence inside one of its outputs (a
  chat template that drops earlier reasoning, or text that tokenizes differently once re-rendered);
- `history_edited`: it departs inside the context (the client edited, dropped or reordered
  earlier messages), or it is an earlier sequence cut short inside its context.

Each turn gets a verdict first (`turn_verdict`): trained (with its advantage), context only (a
real recorded turn that must not carry loss: ineligible, stale, its group pending...; it stays in
the sequence so later turns still extend it), or left out (token ids the model cannot embed, or
longer than the sample cap: no forward pass may see it). A sequence's length is its last turn's
prompt plus output, so the cap on a sample is a cap on its last turn; a turn over it is skipped
with that reason, never dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgw.siblings import sibling_advantages

NON_FINITE = "non-finite advantage"
OVERLONG_MASKED = "overlong: cut by max_tokens (finish_reason length; overlong=mask)"
FLOAT32_MAX = 3.4028234663852886e38  # the update computes in float32: beyond it is infinite
CUT_REASONS = ("branch", "output_retokenized", "history_edited")


class Limits(Protocol):
    """The trainer's settings a verdict reads (trainer.config.TrainerConfig has them)."""

    max_staleness: int
    max_tokens_per_sample: int
    overlong: str  # keep | mask | penalize
    overlong_penalty: float


@dataclass(frozen=True)
class SequenceLimits:
    """The defaults of the settings that decide a session's sequences: trainer.config.TrainerConfig
    reads its defaults from DEFAULT_LIMITS, and the gateway's training view uses them for a model
    whose versions recorded no config (a `Limits`, plus whether turns are joined)."""

    max_staleness: int = 4  # versions a completion may lag behind the current one
    max_tokens_per_sample: int = 2048  # a longer turn is left out with a reason
    overlong: str = "keep"  # cut by max_tokens: keep | mask | penalize
    overlong_penalty: float = 1.0  # with overlong=penalize: subtracted from the advantage
    join_turns: bool = True  # False: every turn a sequence of its own


DEFAULT_LIMITS = SequenceLimits()


class StepLike(Protocol):
    completion_id: str
    model: str | None
    policy_version: int | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str | None
    eligible: bool
    eligibility_reason: str | None
    sampling: Mapping[str, Any] | None


class TrajectoryLike(Protocol):
    session_id: str
    return_normalized: float | None
    steps: Sequence[StepLike]
    sibling_normalization: str
    sibling_groups: Iterable[Any]


@dataclass(frozen=True)
class Verdict:
    """What one turn is to the update: `reason` None and `advantage` set: trained; a reason:
    not trained, as context (`hard` False) or left out of every sequence (`hard` True)."""

    advantage: float | None
    reason: str | None = None
    hard: bool = False


@dataclass(frozen=True)
class Turn:
    """One recorded completion placed in a sequence: its output is token_ids[start:end]."""

    step: StepLike
    start: int
    end: int
    verdict: Verdict

    @property
    def trained(self) -> bool:
        return self.verdict.reason is None


@dataclass(frozen=True)
class Cut:
    """Why a sequence begins at `at` (a completion id) instead of extending an earlier one."""

    at: str
    reason: str  # one of CUT_REASONS
    detail: str


@dataclass
class TrainingSequence:
    """One sequence of a session: its tokens and the turns whose outputs lie in it."""

    session_id: str
    token_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)

    @property
    def trained(self) -> list[Turn]:
        return [t for t in self.turns if t.trained]

    def per_token(self) -> dict[str, list[Any]]:
        """The view's arrays, one entry per token: loss_mask (1 on trained outputs), logprobs
        (the recorded behaviour log-prob on every output token, trained or not; None on
        context), versions (the generating version on output tokens), advantages (0.0 off the
        trained outputs)."""
        n = len(self.token_ids)
        loss_mask, advantages = [0] * n, [0.0] * n
        logprobs: list[float | None] = [None] * n
        versions: list[int | None] = [None] * n
        for t in self.turns:
            logprobs[t.start : t.end] = list(t.step.output_logprobs)
            versions[t.start : t.end] = [t.step.policy_version] * (t.end - t.start)
            if t.trained:
                loss_mask[t.start : t.end] = [1] * (t.end - t.start)
                advantages[t.start : t.end] = [float(t.verdict.advantage)] * (t.end - t.start)
        return {
            "loss_mask": loss_mask,
            "logprobs": logprobs,
            "versions": versions,
            "advantages": advantages,
        }


def turn_verdict(
    step: StepLike,
    advantage: float | None,
    *,
    sibling: bool,
    current_version: int,
    limits: Limits,
    lineage: Mapping[int, int] | None = None,
    vocab_size: int | None = None,
) -> Verdict:
    """Whether `step` is trained (with the advantage it is trained at), context, or left out."""
    if vocab_size is not None:
        ids = (*step.prompt_token_ids, *step.output_token_ids)
        outside = next((i for i in ids if not 0 <= i < vocab_size), None)
        if outside is not None:  # an embedding lookup would raise (IndexError, or a CUDA assert)
            reason = f"token id {outside} is outside the model's vocabulary ({vocab_size} ids)"
            return Verdict(None, reason, hard=True)
    length = len(step.prompt_token_ids) + len(step.output_token_ids)
    if length > limits.max_tokens_per_sample:
        return Verdict(None, f"longer than {limits.max_tokens_per_sample} tokens", hard=True)
    reason = _not_trained(step, advantage, sibling, current_version, limits, lineage)
    if reason is not None:
        return Verdict(None, reason)
    assert advantage is not None
    if not (math.isfinite(advantage) and abs(advantage) < FLOAT32_MAX):
        return Verdict(None, f"{NON_FINITE}: {advantage} (in float32)")
    if step.finish_reason == "length" and limits.overlong != "keep":
        if limits.overlong == "mask":
            return Verdict(None, OVERLONG_MASKED)
        advantage -= limits.overlong_penalty  # penalize: DAPO's overlong punishment
    return Verdict(float(advantage))


def _not_trained(
    step: StepLike,
    advantage: float | None,
    sibling: bool,
    current_version: int,
    limits: Limits,
    lineage: Mapping[int, int] | None,
) -> str | None:
    if advantage is None:
        if sibling:
            return "its sibling group is pending (not every sibling choice is rewarded)"
        return "the session has no normalized return"
    if not step.eligible:
        return f"not eligible: {step.eligibility_reason}"
    if step.policy_version is None:
        return "served version unknown"
    # Versions behind along the lineage (after a rollback, numbers alone would mislead).
    behind = (
        current_version - step.policy_version
        if lineage is None
        else lineage.get(step.policy_version)
    )
    if behind is None:
        return (
            f"generated by version {step.policy_version}, which is not an ancestor of version "
            f"{current_version} (rejected by its gate, or rolled back)"
        )
    if behind > limits.max_staleness:
        return (
            f"stale: generated by version {step.policy_version}, "
            f"{behind} behind (bound {limits.max_staleness})"
        )
    return None


def build_sequences(
    trajectory: TrajectoryLike,
    *,
    current_version: int,
    limits: Limits,
    lineage: Mapping[int, int] | None = None,
    model: str | None = None,
    vocab_size: int | None = None,
    advantage: float | None = None,
    use_session_advantage: bool = False,
    join_turns: bool = True,
) -> list[TrainingSequence]:
    """The sequences of `model`'s turns in `trajectory` (every turn of a step that names no
    model counts as `model`'s; None: every turn), in the record's order.

    A turn's advantage is its sibling group's normalized reward when the session normalizes
    siblings (n > 1), otherwise the session's: `advantage` when `use_session_advantage` (the
    trainer's baseline, trainer/loop/advantages.py), else the trajectory's return_normalized.
    `join_turns` False: every turn is a sequence of its own (the per-turn samples of before).
    Turns left out of every sequence appear in none: `left_out` lists them.
    """
    siblings = sibling_advantages(trajectory)
    session = advantage if use_session_advantage else trajectory.return_normalized
    sequences: list[TrainingSequence] = []
    for step in trajectory.steps:
        if model is not None and step.model not in (None, model):
            continue  # another model's completion: that model's trainer takes it
        sibling = step.completion_id in siblings
        verdict = turn_verdict(
            step,
            siblings[step.completion_id] if sibling else session,
            sibling=sibling,
            current_version=current_version,
            limits=limits,
            lineage=lineage,
            vocab_size=vocab_size,
        )
        if verdict.hard:
            sequences.append(_left_out(trajectory.session_id, step, verdict))
            continue
        host = _host(sequences, step.prompt_token_ids) if join_turns else None
        if host is None:
            host = TrainingSequence(trajectory.session_id, list(step.prompt_token_ids))
            if join_turns:
                cut = _cut(sequences, step)
                host.cuts = [] if cut is None else [cut]
            sequences.append(host)
        else:
            host.token_ids.extend(step.prompt_token_ids[len(host.token_ids) :])
        start = len(host.token_ids)
        host.token_ids.extend(step.output_token_ids)
        host.turns.append(Turn(step, start, len(host.token_ids), verdict))
    return sequences


def _left_out(session_id: str, step: StepLike, verdict: Verdict) -> TrainingSequence:
    """A turn no forward pass may see: a sequence with no tokens, holding only its verdict (so
    that callers find every turn's verdict in one place; it hosts nothing)."""
    return TrainingSequence(session_id, [], [Turn(step, 0, 0, verdict)])


def left_out(sequences: Iterable[TrainingSequence]) -> list[Turn]:
    """The turns left out of every sequence (token ids outside the vocabulary, too long)."""
    return [t for s in sequences if not s.token_ids for t in s.turns]


def trainable(sequences: Iterable[TrainingSequence]) -> list[TrainingSequence]:
    """The sequences an update trains: those with at least one trained turn."""
    return [s for s in sequences if s.token_ids and s.trained]


def _host(sequences: list[TrainingSequence], prompt: list[int]) -> TrainingSequence | None:
    """The longest sequence whose tokens are a prefix of `prompt` (the latest among equals)."""
    best = None
    for s in sequences:
        n = len(s.token_ids)
        extends = 0 < n <= len(prompt) and prompt[:n] == s.token_ids
        if extends and (best is None or n >= len(best.token_ids)):
            best = s
    return best


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _cut(sequences: list[TrainingSequence], step: StepLike) -> Cut | None:
    """Why `step` does not extend any earlier sequence (None: there is none to extend)."""
    prompt = step.prompt_token_ids
    best, shared = None, -1
    for s in sequences:
        if s.token_ids:
            m = _common_prefix(prompt, s.token_ids)
            if m > shared:
                best, shared = s, m
    if best is None:
        return None
    where = next((t for t in best.turns if t.start <= shared < t.end), None)
    if shared == len(prompt):  # the prompt is an earlier sequence cut short
        if any(t.start == shared for t in best.turns):
            reason = "branch"
            detail = f"its prompt is the history before {_at(best, shared)}'s output"
        else:
            reason = "history_edited"
            detail = f"its prompt is an earlier sequence cut short at token {shared}"
    elif where is not None:
        reason = "output_retokenized"
        detail = (
            f"its prompt departs at token {shared}, inside {where.step.completion_id}'s output "
            f"(token {shared - where.start} of it)"
        )
    else:
        reason = "history_edited"
        detail = f"its prompt departs from the earlier turns at token {shared}, in their context"
    return Cut(step.completion_id, reason, detail)


def _at(sequence: TrainingSequence, start: int) -> str:
    return next(t.step.completion_id for t in sequence.turns if t.start == start)
