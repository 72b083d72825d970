"""The policy being trained: its weights on the training device (sharded over the ranks under
torch.distributed), its AdamW state, and rank 0's CPU fp32 reference of the same weights, from
which deltas, parity probes and version files are made.

One process on the CPU trains the reference itself (one copy of the weights, as before). On a GPU,
or with several ranks, the training copy lives on the device (FSDP2 shards when several) and the
reference is refreshed from the gathered weights after each update, on rank 0 only.

With LoRA (`config.lora_rank`) both copies are peft models: the base frozen, the adapter trained
(AdamW over the adapter's parameters only), and the reference refreshed with the adapter alone.
With several ranks a LoRA model is replicated, not sharded (`replicate_model`: DDP): the adapter
is small, every rank holds the whole model, the adapter's gradients are averaged, and every
rank's optimizer takes the same step, so rank 0's optimizer state is everybody's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlgw import test_hooks

from ..config import TrainerConfig
from ..models.lora import adapter_state, copy_adapter, spec_of, with_adapter
from ..models.weights import load_full, load_reference_model, state_dict
from . import collectives
from .device import prepare_model
from .distributed import (
    DistContext,
    broadcast_trainable,
    full_optimizer_state,
    gather_full_state,
    is_rank0,
    load_full_state,
    load_optimizer_state,
    replicate_model,
    shard_model,
    unwrap,
)
from .optimizer_state import (
    INDEX,
    NAME,
    frozen_moments,
    load_state,
    restore_optimizer,
    save_optimizer,
    save_state,
)
from .samples import Sample
from .sampling_processing import eos_ids
from .update import policy_update


class Policy:
    def __init__(
        self, reference: torch.nn.Module, config: TrainerConfig, dist: DistContext
    ) -> None:
        """`reference`: the current version's model, fp32 on the CPU (rank 0: materialized; the
        other ranks: any model of the same architecture, their weights come from rank 0)."""
        self.config, self.dist = config, dist
        self.lora = spec_of(config)
        many = dist.world_size > 1
        self.sharded = many and self.lora is None  # FSDP2 shards
        self.replicated = many and self.lora is not None  # DDP copies (see the docstring)
        if self.lora is not None:
            reference = with_adapter(reference, self.lora)  # a new adapter computes the base
        shares = not many and dist.device.type == "cpu"
        self.reference = reference.eval()
        self.training = (
            prepare_model(reference, config, dist.device)
            if shares
            else prepare_model(copy.deepcopy(reference), config, dist.device)
        )
        if self.sharded:
            shard_model(self.training)
            load_full_state(self.training, state_dict(reference) if is_rank0() else None)
        elif self.replicated:  # DDP gives every rank rank 0's weights, base and adapter
            self.training = replicate_model(self.training)
        self.training.eval()
        self.optimizer = self._new_optimizer()
        config_of = reference.config
        self.pad_id = int(config_of.pad_token_id or config_of.eos_token_id or 0)
        self.stop_ids = eos_ids(reference)  # what min_tokens masked (with a request's own)

    @classmethod
    def for_rank(cls, reference: torch.nn.Module | None, base_path: str | None, config, dist):
        """Rank 0 passes the materialized reference; the others build the architecture from the
        base checkpoint rank 0 names (broadcast), and receive the weights from it. Every rank
        trains with rank 0's config (which the model's recorded mode may have changed: LoRA)."""
        if dist.world_size > 1:
            base_path, config = collectives.broadcast_object(
                (base_path, config) if is_rank0() else None
            )
        if reference is None:
            reference = load_reference_model(base_path)
        return cls(reference, config, dist)

    def update(self, samples: list[Sample], version: int | None = None) -> dict[str, float]:
        """One version's optimisation on every rank, from the weights of `version` (raises
        UpdateOutOfMemory on a device OOM, NonFiniteUpdate with everything as it was)."""
        return policy_update(
            self.training,
            self.optimizer,
            samples,
            self.config,
            self.pad_id,
            scheduled=True,
            current_version=version,
            loss_hook=test_hooks.nan_loss,
            stop_ids=self.stop_ids,  # a no-op unless a test sets RLGW_TEST_NAN_LOSS_STEP
        )

    def weights(self) -> dict[str, torch.Tensor]:
        """The updated weights, whole, fp32 on the CPU, on rank 0 (the reference holds them
        after this); {} on the other ranks. A collective under torch.distributed. With LoRA:
        the adapter's tensors only."""
        if self.lora is not None:
            if not is_rank0():
                return {}
            if self.training is not self.reference:
                copy_adapter(unwrap(self.training), self.reference)
            return adapter_state(self.reference)
        if self.training is self.reference:
            return state_dict(self.reference)
        full = gather_full_state(self.training) if self.sharded else _cpu(self.training)
        if is_rank0():
            load_full(self.reference, full)
        return full

    def reset_to(self, weights: dict[str, torch.Tensor] | None, path: Path, version: int) -> str:
        """Move to another version (a rollback, a rejected candidate): its weights (rank 0
        passes them; None elsewhere), a fresh AdamW, and its moments if they were kept. A
        collective when sharded; returns what happened to the moments."""
        if is_rank0():
            load_full(self.reference, weights)
        if self.training is not self.reference:
            if self.sharded:
                load_full_state(self.training, weights if is_rank0() else None)
            elif self.replicated:  # rank 0's adapter, then everybody's
                if is_rank0():
                    load_full(unwrap(self.training), weights)
                broadcast_trainable(self.training)
            else:
                load_full(self.training, weights)
        self.optimizer = self._new_optimizer()
        return self.restore_moments(path, version)

    def _new_optimizer(self) -> torch.optim.AdamW:
        optimizer = torch.optim.AdamW(
            [p for p in self.training.parameters() if p.requires_grad],  # LoRA: the adapter
            lr=self.config.learning_rate,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        for group in optimizer.param_groups:  # the warmup's base (trainer/loop/update.py), saved
            group["initial_lr"] = group["lr"]  # with the moments and present in every new one
        return optimizer

    # ------------------------------------------------------------------ AdamW moments
    def gather_moments(self) -> dict | None:
        """The optimizer state, whole on rank 0, for `save_moments`. A collective when sharded:
        every rank calls it right after `weights()`, while they are all in the step (rank 0
        then records the version alone, for longer than a collective may wait). None when not
        sharded: the optimizer itself is saved."""
        if not self.sharded:
            return None
        return full_optimizer_state(self.training, self.optimizer)

    def freeze_moments(self, gathered: dict | None) -> dict | None:
        """The optimizer state as `gather_moments` returned it, copied where it is the live
        optimizer's (one process, or replicated: rank 0's), so that the next update's steps leave
        it as it is until `save_moments` writes it (a version published in the background)."""
        if self.sharded or not is_rank0():
            return gathered  # sharded: a gathered copy already
        return frozen_moments(self.optimizer)

    def save_moments(self, gathered: dict | None, path: Path, version: int) -> None:
        """Save the optimizer state reached by `version`, as `gather_moments` (or
        `freeze_moments`) returned it (rank 0 writes; the others do nothing)."""
        if self.sharded:
            if is_rank0():
                save_state(gathered, path, version, keyed_by=NAME)
        elif is_rank0():  # one process, or replicated: rank 0's optimizer is everybody's
            if gathered is not None:  # frozen by freeze_moments
                save_state(gathered, path, version, keyed_by=INDEX)
            else:
                save_optimizer(self.optimizer, path, version)

    def restore_moments(self, path: Path, version: int) -> str:
        """Restore the moments saved for `version`, if any (a collective when distributed)."""
        if self.replicated:  # rank 0 restores its own; the others take its state
            message = restore_optimizer(self.optimizer, path, version) if is_rank0() else ""
            mine = self.optimizer.state_dict() if is_rank0() else None
            state = collectives.broadcast_object(mine)
            if not is_rank0():
                self.optimizer.load_state_dict(state)
            return message
        if not self.sharded:
            return restore_optimizer(self.optimizer, path, version)
        state, message = load_state(path, version, keyed_by=NAME) if is_rank0() else (None, "")
        if collectives.broadcast_object(state is not None):  # every rank, or none, loads
            load_optimizer_state(self.training, self.optimizer, state)
        return message


def _cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state_dict(model).items()}
