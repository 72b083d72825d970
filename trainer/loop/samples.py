"""Token-level training samples, built from the RECORDED tokens of kept completions only.

Imports torch and the pure `rlgw.siblings` only: the trajectory's pydantic schema (and the
database loader beside it) is a type here, so the update path runs where only torch is installed
(`trainer/loop/records.py` reads the same trajectories from their exported JSON).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlgw.sequences import CUT_REASONS, StepLike, TrainingSequence, build_sequences
from rlgw.sequences import OVERLONG_MASKED as OVERLONG_MASKED  # re-exported

from ..config import TrainerConfig
from .sampling_processing import RowSampling, SamplingSettings

if TYPE_CHECKING:
    from rlgw.trajectory import Trajectory


@dataclass(frozen=True)
class Sample:
    session_id: str
    completion_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    behave_logprobs: list[float]  # recorded when the backend generated output_ids
    advantage: float
    version: int  # the policy version that generated it (its first output token)
    # The temperature and masks it was sampled with; None: recorded before they were kept
    # (scored at temperature 1, as then).
    sampling: SamplingSettings | None = None
    # The training sequence it lies in (rlgw/sequences.py): samples that share one are a single
    # row of the update, the last one's prompt + output, each scored at its own output's
    # positions. None: a row of its own.
    sequence: str | None = None
    # Per output token, where a weight swap continued the request on new weights: each token's
    # version (None: every token at `version`) and whether it carries loss (0: too stale,
    # rlgw/sequences.py; None: every token does).
    output_versions: list[int] | None = None
    loss_mask: list[int] | None = None

    def token_versions(self) -> list[int]:
        """The version that generated each output token."""
        return list(self.output_versions or [self.version] * len(self.output_ids))

    def token_mask(self) -> list[int]:
        """1 on each output token that carries loss."""
        return list(self.loss_mask or [1] * len(self.output_ids))

    @property
    def trained_tokens(self) -> int:
        """How many of its output tokens carry loss."""
        return len(self.output_ids) if self.loss_mask is None else sum(self.loss_mask)

    def trained_versions(self) -> list[int]:
        """The versions of the output tokens that carry loss."""
        return [v for v, m in zip(self.token_versions(), self.token_mask(), strict=True) if m]


@dataclass(frozen=True)
class Skip:
    session_id: str
    completion_id: str
    reason: str


def session_sequences(
    t: Trajectory,
    current_version: int,
    config: TrainerConfig,
    lineage: Mapping[int, int] | None,
    model: str | None,
    vocab_size: int | None,
    advantages: Mapping[str, float | None] | None,
) -> list[TrainingSequence]:
    """The training sequences of one session (rlgw/sequences.py) as `build_samples` sees them."""
    return build_sequences(
        t,
        current_version=current_version,
        limits=config,
        lineage=lineage,
        model=model,
        vocab_size=vocab_size,
        advantage=None if advantages is None else advantages.get(t.session_id),
        use_session_advantage=advantages is not None,
        join_turns=config.join_turns,
    )


@dataclass
class Built:
    """What an update is built from: its samples, its skips, and the cuts (rlgw/sequences.py's
    reasons) that begin each session's sequences."""

    samples: list[Sample]
    skips: list[Skip]
    cuts: dict[str, list[str]]  # session id -> the cut reasons of its sequences

    def cut_counts(self, exclude: Collection[str] = ()) -> dict[str, int]:
        """Sequences beginning with each cut reason, over the sessions not in `exclude`: every
        reason of CUT_REASONS, 0 when none (a steady label set for metrics and /metrics)."""
        counts = dict.fromkeys(CUT_REASONS, 0)
        for session_id, reasons in self.cuts.items():
            if session_id not in exclude:
                for reason in reasons:
                    counts[reason] += 1
        return counts


def build_update(
    trajectories: list[Trajectory],
    *,
    current_version: int,
    config: TrainerConfig,
    lineage: Mapping[int, int] | None = None,
    model: str | None = None,
    vocab_size: int | None = None,
    advantages: Mapping[str, float | None] | None = None,
) -> Built:
    """One sample per kept, eligible, fresh-enough completion of `model`; every other one of
    `model` is a Skip. The samples of one session's training sequence (rlgw/sequences.py:
    each turn extends the last, proved from the record) share `sequence`, and train as one row.

    A session may call several models (a planner and a worker): only `model`'s completions are
    this trainer's, the others are another trainer's and appear in neither list (a step that
    names no model, from an export made before steps did, counts as `model`'s). A token id
    outside `vocab_size` (the trained model's embedding rows) is a Skip with the reason, never
    an index error in a forward pass. None: no filter, no vocabulary check.

    A completion's advantage is its session's group-normalized return (the raw return for a
    session without a group), or the session's entry in `advantages` when given (the trainer's
    baselines, trainer/loop/advantages.py): every turn of an episode shares the episode's
    outcome. A sibling choice (n > 1) in a session that normalizes siblings takes its reward
    normalized within its sibling group instead (see `sibling_advantages`). A completion cut by
    max_tokens follows `config.overlong`; a non-finite advantage is a skip (the trainer drops
    its session).
    """
    built = Built([], [], {})
    for t in trajectories:
        sequences = session_sequences(
            t, current_version, config, lineage, model, vocab_size, advantages
        )
        built.cuts[t.session_id] = [c.reason for s in sequences for c in s.cuts]
        for index, sequence in enumerate(sequences):
            key = f"{t.session_id}#{index}" if len(sequence.trained) > 1 else None
            for turn in sequence.turns:
                step, verdict = turn.step, turn.verdict
                if verdict.reason is not None:
                    built.skips.append(Skip(t.session_id, step.completion_id, verdict.reason))
                    continue
                built.samples.append(
                    Sample(
                        t.session_id,
                        step.completion_id,
                        step.prompt_token_ids,
                        step.output_token_ids,
                        step.output_logprobs,
                        float(verdict.advantage),
                        step.policy_version,
                        SamplingSettings.from_record(step.sampling),
                        key,
                        _output_versions(step),
                        None if verdict.token_mask is None else list(verdict.token_mask),
                    )
                )
    return built


def _output_versions(step: StepLike) -> list[int] | None:
    """The step's per-token versions where they are not all its policy_version; else None."""
    versions = step.output_versions
    return None if versions is None or set(versions) <= {step.policy_version} else list(versions)


def build_samples(
    trajectories: list[Trajectory], **options: Any
) -> tuple[list[Sample], list[Skip]]:
    """`build_update`'s samples and skips (same keyword arguments)."""
    built = build_update(trajectories, **options)
    return built.samples, built.skips


def cut_counts(trajectories: list[Trajectory], **options: Any) -> dict[str, int]:
    """How many of the sequences `build_update` builds from `trajectories` (same keyword
    arguments) begin with each cut reason (`Built.cut_counts`)."""
    return build_update(trajectories, **options).cut_counts()


def sequence_rows(samples: list[Sample]) -> list[list[Sample]]:
    """The samples grouped into the rows of an update: a training sequence's samples together
    (in their order), every other sample alone; rows in order of first appearance."""
    rows: list[list[Sample]] = []
    by_key: dict[str, list[Sample]] = {}
    for s in samples:
        if s.sequence is None:
            rows.append([s])
        elif s.sequence in by_key:
            by_key[s.sequence].append(s)
        else:
            by_key[s.sequence] = [s]
            rows.append(by_key[s.sequence])
    return rows


def row_tokens(row: list[Sample]) -> list[int]:
    """A row's tokens: its longest sample's prompt + output (every other sample's prompt +
    output is a prefix of it, rlgw/sequences.py)."""
    last = max(row, key=lambda s: len(s.prompt_ids) + len(s.output_ids))
    return last.prompt_ids + last.output_ids


@dataclass
class Unit:
    """Rows laid in a line as one piece: their first `shared` tokens (the same in every row)
    once, then each row's remaining tokens, a branch that sees the shared tokens and itself only
    (trainer/loop/prefix_sharing.py). A plain row is a unit of one row with nothing shared."""

    rows: list[list[Sample]]
    shared: int = 0

    @property
    def length(self) -> int:
        """Its tokens in a line."""
        return self.shared + sum(len(row_tokens(row)) - self.shared for row in self.rows)


@dataclass
class Batch:
    """Lines of tokens in tensors; position t of `targets` is predicted from inputs[:, :t+1]. A
    line holds one row, right-padded (`collate`), or several rows end to end (`collate_lines`,
    packed: `positions` restart at each row). A row is one sample, or the samples of one
    training sequence (`sequence_rows`)."""

    inputs: torch.Tensor  # (B, L) each row's prompt + output, rows end to end, right-padded
    attention: torch.Tensor  # (B, L) 1 on real tokens
    targets: torch.Tensor  # (B, L-1) inputs shifted by one
    mask: torch.Tensor  # (B, L-1) 1 where the target is a trained output token
    behave: torch.Tensor  # (B, L-1) recorded log-prob at output targets, 0 elsewhere
    advantages: torch.Tensor  # (B, L-1) each output's advantage at its targets, 0 elsewhere
    # Per-position temperature and masks, where they are not neutral; None: all at temperature 1.
    sampling: RowSampling | None = None
    # (B, L-1) the version that generated each output target, -1 elsewhere; None: not known.
    versions: torch.Tensor | None = None
    # Packed lines only (None: one row per line): (B, L) each token's position within its row,
    # from 0 at each row's first token (the model keeps attention within a row by them), and
    # (B, L-1) the index of the row each target lies in, -1 on padding.
    positions: torch.Tensor | None = None
    segments: torch.Tensor | None = None
    # Lines with shared prefixes only (None: none shared): (B, L) the unit each token lies in, and
    # the row of its branch (-1 on a shared prefix and on padding): the attention mask's inputs
    # (trainer/loop/prefix_sharing.py, `tree_attention_mask`).
    units: torch.Tensor | None = None
    branches: torch.Tensor | None = None


def collate(samples: list[Sample], pad_id: int, stop_ids: tuple[int, ...] = ()) -> Batch:
    """The samples' rows padded into one batch, a row per line. `stop_ids`: the model's
    end-of-sequence ids, which a completion sampled with min_tokens could not produce before it
    had that many."""
    return collate_lines([[row] for row in sequence_rows(samples)], pad_id, stop_ids)


def collate_lines(
    lines: list[list[list[Sample]]], pad_id: int, stop_ids: tuple[int, ...] = ()
) -> Batch:
    """Lines of rows (`sequence_rows`) into one batch: each line's rows end to end, the line
    right-padded to the longest. With a row per line this is the padded batch; with several,
    a packed one (`positions`, `segments`). `stop_ids`: as in `collate`."""
    return collate_units([[Unit([row]) for row in line] for line in lines], pad_id, stop_ids)


def collate_units(lines: list[list[Unit]], pad_id: int, stop_ids: tuple[int, ...] = ()) -> Batch:
    """Lines of units (`Unit`) into one batch, as `collate_lines`; where a unit shares a prefix,
    the batch also carries `units` and `branches`, from which the update builds its mask."""
    packed = any(len(line) > 1 or len(line[0].rows) > 1 for line in lines)
    shared = any(unit.shared for line in lines for unit in line)
    length = max(sum(unit.length for unit in line) for line in lines)
    b = len(lines)
    inputs = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros(b, length, dtype=torch.long)
    positions = torch.zeros(b, length, dtype=torch.long)
    segments = torch.full((b, length - 1), -1, dtype=torch.long)
    units = torch.full((b, length), -1, dtype=torch.long)
    branches = torch.full((b, length), -1, dtype=torch.long)
    mask = torch.zeros(b, length - 1)
    behave = torch.zeros(b, length - 1)
    advantages = torch.zeros(b, length - 1)
    versions = torch.full((b, length - 1), -1, dtype=torch.long)
    spans: list[list[tuple[int, int, SamplingSettings | None]]] = []
    index, unit_index = 0, 0  # the row's and the unit's index in the batch
    for i, line in enumerate(lines):
        spans.append([])
        at = 0  # where the next piece starts in its line
        for unit in line:
            c = unit.shared
            if c:  # the prefix, once
                inputs[i, at : at + c] = torch.tensor(row_tokens(unit.rows[0])[:c])
                attention[i, at : at + c] = 1
                positions[i, at : at + c] = torch.arange(c)
                units[i, at : at + c] = unit_index
                at += c
            for row in unit.rows:
                ids = row_tokens(row)[c:]
                n = len(ids)
                inputs[i, at : at + n] = torch.tensor(ids)
                attention[i, at : at + n] = 1
                positions[i, at : at + n] = torch.arange(c, c + n)
                segments[i, at : at + n - 1] = index
                units[i, at : at + n], branches[i, at : at + n] = unit_index, index
                start = at - c  # where the row's token 0 would lie: token k >= c lies at start + k
                for s in row:
                    p, o = start + len(s.prompt_ids), len(s.output_ids)
                    # The output token at position p + j is predicted at target index p + j - 1,
                    # in the row's own tokens (a prefix is shared short of every prompt's end).
                    if p - 1 < at:
                        raise ValueError(f"unit shares {c} tokens, past {s.completion_id}'s prompt")
                    trained = torch.tensor(s.token_mask(), dtype=mask.dtype)
                    mask[i, p - 1 : p + o - 1] = trained
                    behave[i, p - 1 : p + o - 1] = torch.tensor(s.behave_logprobs)
                    advantages[i, p - 1 : p + o - 1] = s.advantage * trained
                    versions[i, p - 1 : p + o - 1] = torch.tensor(
                        s.token_versions(), dtype=torch.long
                    )
                    spans[i].append((p - 1, p + o - 1, s.sampling))
                at, index = at + n, index + 1
            unit_index += 1
        positions[i, at:] = torch.arange(length - at)  # the padding: a segment of its own
        units[i, at:] = unit_index
        unit_index += 1
    sampling = RowSampling.of(spans, mask.shape, stop_ids)
    batch = Batch(inputs, attention, inputs[:, 1:], mask, behave, advantages, sampling, versions)
    if packed:
        batch.positions, batch.segments = positions, segments
    if shared:
        batch.units, batch.branches = units, branches
    return batch
