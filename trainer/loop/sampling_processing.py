"""The trainer's log-probs under the processing vLLM sampled with: min_tokens, temperature, min-p,
top-k, top-p.

vLLM 0.32's sampler (vllm/v1/sample/sampler.py, `--logprobs-mode processed_logprobs`) turns a
row's logits into the distribution it samples from, and reports, in this order: while fewer than
`min_tokens` tokens are out, the stop tokens (the model's end-of-sequence ids and the request's
`stop_token_ids`) are set to -inf (`MinTokensLogitsProcessor`, before the temperature); divide by
the temperature; min-p (`MinPLogitsProcessor`: drop tokens whose probability is below min_p times
the largest); top-k (drop logits below the k-th largest, ties kept); top-p (sort ascending, softmax
over what is left, drop the prefix whose cumulative probability is <= 1 - p, always keeping the
largest); then log_softmax over the kept tokens. `processed_token_logprobs` does the same, on the
output positions that need it only (T=1 and unmasked positions keep the plain path).

One rule of our own: the sampled token is always kept. vLLM sampled it from the kept set, so with
the serving weights it is kept anyway (up to float noise at the boundary); with other weights
(the proximal or current policy after an update) it may fall outside their mask, and a log-prob of
-inf would make the importance ratio 0 or infinite. Measured error: docs/training.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

# Rows of logits whose masks are computed at once: bounds the sort's extra memory
# (a float32 copy and int64 indices of CHUNK x vocabulary).
CHUNK = 512


def eos_ids(model: Any) -> tuple[int, ...]:
    """A model's end-of-sequence ids: its config's `eos_token_id` (the tokenizer's EOS, which a
    checkpoint's config names too) and its generation config's (an id or a list): the stop
    tokens vLLM's min_tokens masks besides a request's stop_token_ids (vLLM reads
    generation_config.json's eos ids even with `--generation-config vllm`)."""
    ids: set[int] = set()
    for config in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))
    return tuple(sorted(ids))


@dataclass(frozen=True)
class SamplingSettings:
    """The settings of one completion the trainer reproduces (the rest make it ineligible)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 (or -1, or >= the vocabulary): off
    top_p: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0  # the first min_tokens outputs could not be a stop token
    stop_token_ids: tuple[int, ...] = ()  # the request's; the model's EOS ids are added to them

    @classmethod
    def from_record(cls, sampling: Mapping[str, Any] | None) -> SamplingSettings | None:
        """From a completion's recorded `sampling` (rlgw.sampling.effective_sampling); None for a
        completion recorded before the settings were kept (scored at temperature 1, as then)."""
        if sampling is None:
            return None
        return cls(
            temperature=float(sampling.get("temperature", 1.0)),
            top_k=int(sampling.get("top_k", 0)),
            top_p=float(sampling.get("top_p", 1.0)),
            min_p=float(sampling.get("min_p", 0.0)),
            min_tokens=int(sampling.get("min_tokens") or 0),
            stop_token_ids=tuple(int(i) for i in sampling.get("stop_token_ids") or ()),
        )

    @property
    def neutral(self) -> bool:
        """The plain log_softmax of the logits: temperature 1, no mask."""
        return (
            self.temperature == 1.0
            and self.top_k <= 0
            and self.top_p >= 1.0
            and not self.min_p
            and not self.min_tokens
        )


@dataclass
class RowSampling:
    """A batch's settings per position (B, T), and the positions (B, T) to score under them: the
    output positions whose settings are not neutral. (Per position, not per row: the turns of
    one training sequence may each have been sampled with settings of their own.)"""

    temperature: torch.Tensor  # (B, T) float
    top_k: torch.Tensor  # (B, T) long, 0: off
    top_p: torch.Tensor  # (B, T) float
    min_p: torch.Tensor  # (B, T) float
    positions: torch.Tensor  # (B, T) bool
    # (B, T) long: the index in `stop_sets` of the stop tokens masked at a position (inside its
    # output's first min_tokens), -1: none
    stop_set: torch.Tensor | None = None
    stop_sets: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of(
        cls,
        spans: list[list[tuple[int, int, SamplingSettings | None]]],
        shape: tuple[int, ...] | torch.Size,
        stop_ids: tuple[int, ...] = (),
    ) -> RowSampling | None:
        """For each row's output spans [start, end) of target positions with their settings,
        in a batch of `shape` (B, T); None when every span is neutral (the batch keeps the
        plain path). `stop_ids`: the model's end-of-sequence ids, which min_tokens masks with
        each request's own stop_token_ids."""
        hot = [
            (i, start, end, s)
            for i, row in enumerate(spans)
            for start, end, s in row
            if s is not None and not s.neutral
        ]
        if not hot:
            return None
        temperature = torch.ones(shape, dtype=torch.float32)
        top_k = torch.zeros(shape, dtype=torch.long)
        top_p = torch.ones(shape, dtype=torch.float32)
        min_p = torch.zeros(shape, dtype=torch.float32)
        positions = torch.zeros(shape, dtype=torch.bool)
        stop_set = torch.full(shape, -1, dtype=torch.long)
        sets: dict[tuple[int, ...], int] = {}
        for i, start, end, s in hot:
            temperature[i, start:end] = s.temperature
            top_k[i, start:end] = max(s.top_k, 0)
            top_p[i, start:end] = s.top_p
            min_p[i, start:end] = s.min_p
            positions[i, start:end] = True
            if s.min_tokens > 0:
                stops = tuple(sorted({*stop_ids, *s.stop_token_ids}))
                index = sets.setdefault(stops, len(sets))
                stop_set[i, start : min(end, start + s.min_tokens)] = index
        if not sets:
            return cls(temperature, top_k, top_p, min_p, positions)
        return cls(temperature, top_k, top_p, min_p, positions, stop_set, tuple(sets))

    def to(self, device: torch.device) -> RowSampling:
        moved = [t.to(device, non_blocking=True) for t in self._tensors()]
        stop_set = None if self.stop_set is None else self.stop_set.to(device, non_blocking=True)
        return RowSampling(*moved, stop_set, self.stop_sets)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.positions)

    def stops_at(self, rows: torch.Tensor, cols: torch.Tensor) -> StopSets | None:
        """The stop tokens min_tokens masks at the positions (rows, cols); None: none there."""
        if self.stop_set is None:
            return None
        chosen = self.stop_set[rows, cols]
        return StopSets(chosen, self.stop_sets) if bool((chosen >= 0).any()) else None


@dataclass(frozen=True)
class StopSets:
    """For N positions, the index (N,) of the stop-token set min_tokens masks there (-1: none)."""

    chosen: torch.Tensor
    sets: tuple[tuple[int, ...], ...]

    def mask(self, start: int, end: int, vocab: int) -> torch.Tensor:
        """(end - start, V) True on the stop tokens masked at positions start..end-1."""
        chosen = self.chosen[start:end]
        mask = torch.zeros(chosen.shape[0], vocab, dtype=torch.bool, device=chosen.device)
        for index, stops in enumerate(self.sets):
            at = (chosen == index).nonzero(as_tuple=True)[0]
            ids = torch.tensor([i for i in stops if 0 <= i < vocab], dtype=torch.long)
            if at.numel() and ids.numel():
                mask[at.unsqueeze(1), ids.to(chosen.device).unsqueeze(0)] = True
        return mask


@torch.no_grad()
def dropped(
    scaled: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    tokens: torch.Tensor,
    stops: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which tokens vLLM's min_tokens, min-p, top-k and top-p masks drop (N, V), from the
    temperature-scaled float32 logits (N, V), per-row k (0: off), p and min_p (N,) and the stop
    tokens min_tokens masks (N, V; None: none); `tokens` (N,) are always kept."""
    n, vocab = scaled.shape
    drop = torch.zeros_like(scaled, dtype=torch.bool) if stops is None else stops.clone()
    x = scaled.masked_fill(drop, -float("inf"))
    if bool((min_p > 0).any()):
        probs = x.softmax(dim=-1)
        drop |= probs < probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        x.masked_fill_(drop, -float("inf"))
    k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
    use_k, use_p = bool((k < vocab).any()), bool((top_p < 1.0).any())
    if use_k or use_p:
        ordered, order = x.sort(dim=-1, descending=False)
        cut = torch.zeros_like(ordered, dtype=torch.bool)
        if use_k:
            kth = ordered.gather(1, (vocab - k).unsqueeze(1))  # the k-th largest value
            cut |= ordered < kth
            ordered = ordered.masked_fill(cut, -float("inf"))
        if use_p:
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            below = cumulative <= (1.0 - top_p).unsqueeze(1)
            below[:, -1] = False  # the largest always stays
            cut |= below
        drop |= torch.zeros_like(cut).scatter_(1, order, cut)
    drop[torch.arange(n, device=drop.device), tokens] = False
    return drop


def processed_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    stops: StopSets | None = None,
) -> torch.Tensor:
    """log p(tokens) (N,) under the processed distribution of logits (N, V) with per-row
    settings (N,) and the stop tokens min_tokens masks (None: none); differentiable in the
    logits (the masks are constants)."""
    scaled = logits.float() / temperature.unsqueeze(1)
    drop = torch.cat(
        [
            dropped(
                scaled[i : i + CHUNK].detach(),
                top_k[i : i + CHUNK],
                top_p[i : i + CHUNK],
                min_p[i : i + CHUNK],
                tokens[i : i + CHUNK],
                None if stops is None else stops.mask(i, i + CHUNK, scaled.shape[1]),
            )
            for i in range(0, scaled.shape[0], CHUNK)
        ]
    )
    logprobs = torch.log_softmax(scaled.masked_fill(drop, -float("inf")), dim=-1)
    return logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def processed_token_logprobs(
    plain: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor, sampling: RowSampling
) -> torch.Tensor:
    """`plain` (B, T), the temperature-1 log-probs of `tokens` (B, T) under `logits` (B, T, V),
    with the positions `sampling` names replaced by their processed log-probs."""
    rows, cols = sampling.positions.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return plain
    values = processed_logprobs(
        logits[rows, cols],
        tokens[rows, cols],
        sampling.temperature[rows, cols],
        sampling.top_k[rows, cols],
        sampling.top_p[rows, cols],
        sampling.min_p[rows, cols],
        sampling.stops_at(rows, cols),
    )
    return plain.index_put((rows, cols), values.to(plain.dtype))
