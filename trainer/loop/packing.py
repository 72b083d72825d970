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

Lines are packed from units (`samples.Unit`): a row, or rows that share a prefix computed once
(prefix_sharing.py), where the model's attention takes the 4D mask that keeps them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import TrainerConfig
from .microbatch import check_row_length, pack_microbatches
from .prefix_sharing import attention_weight, share_prefixes
from .samples import Batch, Sample, Unit, collate, collate_units, sequence_rows

# The families whose transformers models build their masks with `create_causal_mask` (packed
# sequences read from the positions), under the attention implementations that read them.
PACKED_FAMILIES = ("llama", "qwen2", "qwen3")
PACKED_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# The attention implementations that take the 4D mask of shared prefixes (prefix_sharing.py).
SHARED_ATTENTION = ("sdpa", "eager")

Row = list[Sample]  # a sample, or the samples of one training sequence (`sequence_rows`)
Line = list[Row]


@dataclass
class _Group:
    """A micro-batch being packed: lines of units no longer than `width` tokens each."""

    width: int  # its first unit's length: units come longest first
    lines: list[list[Unit]]
    fills: list[int]  # tokens in each line

    def fit(self, unit: Unit, n: int) -> bool:
        """Put the unit at the end of the first line with room for it; whether one had."""
        for k, fill in enumerate(self.fills):
            if fill + n <= self.width:
                self.lines[k].append(unit)
                self.fills[k] += n
                return True
        return False

    def new_line(self, unit: Unit, n: int, max_tokens: int) -> bool:
        """Start a line with the unit if one more line fits the budget; whether it did."""
        if (len(self.lines) + 1) * self.width > max_tokens:
            return False
        self.lines.append([unit])
        self.fills.append(n)
        return True


def pack_units(units: list[Unit], max_tokens: int) -> list[list[list[Unit]]]:
    """Units in micro-batches of lines, first fit in descending length: a micro-batch's width is
    its first (longest) unit, each line's units fit in the width, and lines x width <=
    max_tokens. A unit longer than max_tokens: `SampleTooLong` (as `pack_microbatches`)."""
    groups: list[_Group] = []
    for unit in sorted(units, key=lambda u: -u.length):
        n = unit.length
        if len(unit.rows) == 1:
            check_row_length(unit.rows[0], max_tokens)
        placed = any(g.fit(unit, n) for g in groups) or any(
            g.new_line(unit, n, max_tokens) for g in groups
        )
        if not placed:
            groups.append(_Group(n, [[unit]], [n]))
    return [g.lines for g in groups]


def pack_lines(samples: list[Sample], max_tokens: int) -> list[list[Line]]:
    """The samples' rows in micro-batches of lines (`pack_units`, a row per unit)."""
    groups = pack_units([Unit([row]) for row in sequence_rows(samples)], max_tokens)
    return [[[unit.rows[0] for unit in line] for line in lines] for lines in groups]


def shared_units(samples: list[Sample], max_tokens: int, alpha: float) -> list[Unit]:
    """The samples' rows as units that share their prefixes (prefix_sharing.py), a unit that
    would not fit the budget split back into its rows."""
    units: list[Unit] = []
    for unit in share_prefixes(sequence_rows(samples), alpha):
        if len(unit.rows) > 1 and unit.length > max_tokens:
            units.extend(Unit([row]) for row in unit.rows)
        else:
            units.append(unit)
    return units


def model_config(model: torch.nn.Module) -> object | None:
    """The transformers config of `model`, inside a DDP, FSDP2 or peft wrapper too."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(inner, "config", None)


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether `model` keeps attention within each row of a packed line: a transformers model of
    PACKED_FAMILIES under PACKED_ATTENTION, with a transformers that reads packed positions
    (inside a DDP, FSDP2 or peft wrapper too). Otherwise the update pads."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:  # an older transformers: sdpa and eager would attend across rows
        return False
    config = model_config(model)
    return (
        getattr(config, "model_type", None) in PACKED_FAMILIES
        and getattr(config, "_attn_implementation", None) in PACKED_ATTENTION
    )


def use_packing(config: TrainerConfig, model: torch.nn.Module) -> bool:
    """Whether the update packs its micro-batches: `packing` on or auto, where the model can."""
    return config.packing != "off" and supports_packing(model)


def prefix_sharing(config: TrainerConfig, model: torch.nn.Module) -> float | None:
    """The attention weight (prefix_sharing.py) with which packed lines share prefixes, or None:
    `share_prefixes` on, the update packing, and an attention that takes a 4D mask."""
    if not (config.share_prefixes and use_packing(config, model)):
        return None
    config = model_config(model)
    if getattr(config, "_attn_implementation", None) not in SHARED_ATTENTION:
        return None
    return attention_weight(config)


def collate_microbatches(
    samples: list[Sample],
    max_tokens: int,
    pad_id: int,
    stop_ids: tuple[int, ...] = (),
    *,
    packed: bool,
    share: float | None = None,
) -> list[Batch]:
    """The samples in micro-batches of at most max_tokens (lines x width), on the CPU: packed
    lines (`pack_units`), their rows sharing prefixes where `share` (an attention weight,
    `prefix_sharing`) is given, or a padded row per line (`pack_microbatches`)."""
    if packed:
        if share is None:
            units = [Unit([row]) for row in sequence_rows(samples)]
        else:
            units = shared_units(samples, max_tokens, share)
        return [collate_units(lines, pad_id, stop_ids) for lines in pack_units(units, max_tokens)]
    return [collate(g, pad_id, stop_ids) for g in pack_microbatches(samples, max_tokens)]


def padding_fraction(batches: list[Batch]) -> float:
    """The share of padding among the micro-batches' tokens (lines x width)."""
    total = sum(b.attention.numel() for b in batches)
    return 1.0 - sum(int(b.attention.sum()) for b in batches) / max(total, 1)
