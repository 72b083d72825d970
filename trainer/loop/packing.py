"""Packed micro-batches: rows end to end in lines, attention kept within each row by its positions.

A padded micro-batch is a rectangle, rows x longest; agent answers vary widely in length, so much
of it can be padding. Packed, a micro-batch is a few lines, each holding several rows end to end,
with position ids that restart at each row. transformers (where `masking_utils` has
`find_packed_sequence_indices`; 5.19 here) reads restarting positions, given no attention mask and
no cache, as packed sequences: sdpa and
eager get a block-diagonal causal mask, flash-attention its variable-length kernel. So each row's
log-probs are the padded path's, to float tolerance.

A line is no longer than the micro-batch's longest row: with a mask, attention costs
lines x width^2, so one line of the whole budget would cost far more than the padding it saves.
Packed this way, a line's attention costs what a padded row of the same width would, and a
micro-batch needs fewer lines than padded rows. Padding remains only at the ends of the lines.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import TrainerConfig
from .microbatch import check_row_length, pack_microbatches
from .samples import Batch, Sample, collate, collate_lines, row_tokens, sequence_rows

# The families whose transformers models build their masks with `create_causal_mask` (packed
# sequences read from the positions), under the attention implementations that read them.
PACKED_FAMILIES = ("llama", "qwen2", "qwen3")
PACKED_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")

Row = list[Sample]  # a sample, or the samples of one training sequence (`sequence_rows`)
Line = list[Row]


@dataclass
class _Group:
    """A micro-batch being packed: lines of rows no longer than `width` tokens each."""

    width: int  # its first row's length: rows come longest first
    lines: list[Line]
    fills: list[int]  # tokens in each line

    def fit(self, row: Row, n: int) -> bool:
        """Put the row at the end of the first line with room for it; whether one had."""
        for k, fill in enumerate(self.fills):
            if fill + n <= self.width:
                self.lines[k].append(row)
                self.fills[k] += n
                return True
        return False

    def new_line(self, row: Row, n: int, max_tokens: int) -> bool:
        """Start a line with the row if one more line fits the budget; whether it did."""
        if (len(self.lines) + 1) * self.width > max_tokens:
            return False
        self.lines.append([row])
        self.fills.append(n)
        return True


def pack_lines(samples: list[Sample], max_tokens: int) -> list[list[Line]]:
    """The samples' rows in micro-batches of lines, first fit in descending length: a micro-batch's
    width is its first (longest) row, each line's rows fit in the width, and lines x width <=
    max_tokens. Rows longer than max_tokens: `SampleTooLong` (as `pack_microbatches`)."""
    groups: list[_Group] = []
    for row in sorted(sequence_rows(samples), key=lambda r: -len(row_tokens(r))):
        n = check_row_length(row, max_tokens)
        placed = any(g.fit(row, n) for g in groups) or any(
            g.new_line(row, n, max_tokens) for g in groups
        )
        if not placed:
            groups.append(_Group(n, [[row]], [n]))
    return [g.lines for g in groups]


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether `model` keeps attention within each row of a packed line: a transformers model of
    PACKED_FAMILIES under PACKED_ATTENTION, with a transformers that reads packed positions
    (inside a DDP, FSDP2 or peft wrapper too). Otherwise the update pads."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:  # an older transformers: sdpa and eager would attend across rows
        return False
    inner = getattr(model, "module", model)  # DistributedDataParallel
    config = getattr(inner, "config", None)
    return (
        getattr(config, "model_type", None) in PACKED_FAMILIES
        and getattr(config, "_attn_implementation", None) in PACKED_ATTENTION
    )


def use_packing(config: TrainerConfig, model: torch.nn.Module) -> bool:
    """Whether the update packs its micro-batches: `packing` on or auto, where the model can."""
    return config.packing != "off" and supports_packing(model)


def collate_microbatches(
    samples: list[Sample],
    max_tokens: int,
    pad_id: int,
    stop_ids: tuple[int, ...] = (),
    *,
    packed: bool,
) -> list[Batch]:
    """The samples in micro-batches of at most max_tokens (lines x width), on the CPU: packed
    lines (`pack_lines`), or a padded row per line (`pack_microbatches`)."""
    if packed:
        return [collate_lines(lines, pad_id, stop_ids) for lines in pack_lines(samples, max_tokens)]
    return [collate(g, pad_id, stop_ids) for g in pack_microbatches(samples, max_tokens)]


def padding_fraction(batches: list[Batch]) -> float:
    """The share of padding among the micro-batches' tokens (lines x width)."""
    total = sum(b.attention.numel() for b in batches)
    return 1.0 - sum(int(b.attention.sum()) for b in batches) / max(total, 1)
