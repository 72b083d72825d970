"""Shared prefixes trained once: rows that begin with the same tokens share one copy of them.

A group's samples of one task all start with the same prompt, and an agent's sessions with the
same system prompt; a packed line (trainer/loop/packing.py) still computes that prompt once per
row. Here rows with a common prefix become one unit (`samples.Unit`): the prefix once, then each
row's remaining tokens as a branch whose positions continue the prefix's, under a mask that lets
a branch see the prefix and itself only. Every token then has the context it has alone, so its
log-prob is the padded path's to float tolerance, and the gradients through the prefix are the
sum of what each row sent it (tests/unit/test_prefix_sharing.py).

A prefix is shared short of the end of every row's first prompt (at least one prompt token stays
in each branch): a trained token is always predicted from its own branch, never from a position
the rows hold in common, so the loss terms are the padded path's.

Which rows to join is a cost question: a unit's attention is dense over its whole width (a mask,
no causal kernel), so a long unit can cost more than the tokens it saves. Rows are sorted by
their tokens (rows with long common prefixes become neighbours) and split into runs that
minimise, over the runs, tokens x (1 + alpha x width): the model's per-token cost plus its
attention's, alpha = the attention FLOPs of one query-key pair over one token's projection and MLP
FLOPs (`attention_weight`, ~3e-4 for the default model).
"""

from __future__ import annotations

import torch

from rlgw.sequences import common_prefix

from .samples import Sample, Unit, row_tokens

Row = list[Sample]  # a sample, or the samples of one training sequence (`sequence_rows`)

MAX_UNIT_ROWS = 64  # rows in one unit at most (bounds the search)
DEFAULT_ALPHA = 3e-4  # `attention_weight` of a model whose config does not say


def attention_weight(config: object | None) -> float:
    """One query-key pair's attention FLOPs over one token's linear FLOPs in a decoder layer
    (4 h against 2 x the layer's weights); DEFAULT_ALPHA where the config lacks the sizes."""
    hidden = getattr(config, "hidden_size", None)
    inter = getattr(config, "intermediate_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if not (hidden and inter and heads):
        return DEFAULT_ALPHA
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    layer = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * inter
    return 2 * heads * head_dim / layer


def shareable(row: Row) -> int:
    """How many of the row's leading tokens a unit may hold in common: all of its first prompt
    but the last token."""
    return max(len(row[0].prompt_ids) - 1, 0)


def share_prefixes(rows: list[Row], alpha: float = DEFAULT_ALPHA) -> list[Unit]:
    """The rows as units, cheapest first-to-last split of their sorted order (module docstring):
    each unit either one row, or several that share their common prefix. Every row is in
    exactly one unit."""
    if not rows:
        return []
    ordered = sorted(rows, key=row_tokens)
    tokens = [row_tokens(r) for r in ordered]
    limits = [shareable(r) for r in ordered]
    lcp = [common_prefix(tokens[k], tokens[k + 1]) for k in range(len(ordered) - 1)]

    def cost(length: int) -> float:
        return length * (1.0 + alpha * length)

    # best[j]: the cheapest split of the first j rows; choice[j]: where its last unit starts
    best = [0.0] + [float("inf")] * len(ordered)
    choice = [0] * (len(ordered) + 1)
    for j in range(1, len(ordered) + 1):
        shared, total = limits[j - 1], 0
        for i in range(j - 1, max(j - 1 - MAX_UNIT_ROWS, -1), -1):  # the unit: rows i .. j-1
            if i < j - 1:
                shared = min(shared, limits[i], lcp[i])
            total += len(tokens[i])
            n = j - i
            length = total - (n - 1) * shared if n > 1 else total
            if best[i] + cost(length) < best[j]:
                best[j], choice[j] = best[i] + cost(length), i
    units: list[Unit] = []
    j = len(ordered)
    while j:
        i = choice[j]
        units.append(_unit(ordered[i:j], limits[i:j], lcp[i : j - 1]))
        j = i
    return units[::-1]


def _unit(rows: list[Row], limits: list[int], lcp: list[int]) -> Unit:
    if len(rows) == 1:
        return Unit(rows)
    return Unit(rows, min(*limits, *lcp))


def saved_tokens(units: list[Unit]) -> int:
    """Tokens the units do not compute again."""
    return sum((len(u.rows) - 1) * u.shared for u in units)


def tree_attention_mask(
    units: torch.Tensor, branches: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """(B, 1, L, L) from a batch's `units` and `branches` (B, L): query q sees key k when k <= q
    in the same unit and k is a shared token or in q's branch. Boolean (True: sees), or additive
    in `dtype` (0 / the dtype's lowest) for attention that adds its mask."""
    length = units.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=units.device).tril()
    same_unit = units[:, :, None] == units[:, None, :]
    visible = (branches[:, None, :] == -1) | (branches[:, :, None] == branches[:, None, :])
    allowed = (causal & same_unit & visible)[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=units.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
