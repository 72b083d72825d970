"""Token-budgeted micro-batches: rows packed so that rows x longest <= the budget.

A row is a sample, or the samples of one training sequence (`sequence_rows`), never split.
Padding counts: a micro-batch costs its padded rectangle, B x L tokens. Rows are packed in length
order (shortest first), which keeps padding small; the order does not change the update, since
gradients are summed over micro-batches. (trainer/loop/packing.py lays several rows end to end in
a line instead.)
"""

from __future__ import annotations

import dataclasses

import torch

from .samples import Batch, Sample, row_tokens, sequence_rows


class SampleTooLong(ValueError):
    """A sample longer than the micro-batch budget (build_samples skips these: see config)."""


def sample_tokens(sample: Sample) -> int:
    return len(sample.prompt_ids) + len(sample.output_ids)


def check_row_length(row: list[Sample], max_tokens: int) -> int:
    """The row's token count; SampleTooLong if it exceeds the micro-batch budget."""
    length = len(row_tokens(row))
    if length > max_tokens:
        raise SampleTooLong(
            f"sample {row[-1].completion_id} has {length} tokens, more than "
            f"max_tokens_per_microbatch={max_tokens}; keep max_tokens_per_sample <= "
            "max_tokens_per_microbatch so that build_samples skips it with a reason"
        )
    return length


def pack_microbatches(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Greedy packing of the samples' rows in ascending length: each group's rows x longest <=
    max_tokens; a training sequence's samples stay in one group."""
    groups: list[list[Sample]] = []
    current: list[list[Sample]] = []
    for row in sorted(sequence_rows(samples), key=lambda r: len(row_tokens(r))):
        length = check_row_length(row, max_tokens)
        if current and (len(current) + 1) * length > max_tokens:
            groups.append([s for r in current for s in r])
            current = []
        current.append(row)
    if current:
        groups.append([s for r in current for s in r])
    return groups


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Every tensor of the batch on `device` (pinned and asynchronous when copying to a GPU)."""
    moved = {}
    for field in dataclasses.fields(batch):
        tensor = getattr(batch, field.name)
        if not isinstance(tensor, torch.Tensor):  # the sampling settings: None, or their own
            moved[field.name] = None if tensor is None else tensor.to(device)
            continue
        if device.type == "cuda":
            tensor = tensor.pin_memory()
        moved[field.name] = tensor.to(device, non_blocking=True)
    return Batch(**moved)


def empty_batch(pad_id: int, device: torch.device) -> Batch:
    """A micro-batch with no trained token: a rank with fewer micro-batches than another runs
    these, so that every rank takes part in each sharded forward and backward (FSDP2's
    all-gathers and reduce-scatters are collectives). Its loss is 0 and so are its gradients."""
    inputs = torch.full((1, 2), pad_id, dtype=torch.long, device=device)  # (1, 2)
    zeros = torch.zeros(1, 1, device=device)  # (1, L-1)
    return Batch(inputs, torch.ones_like(inputs), inputs[:, 1:], zeros, zeros, zeros)
