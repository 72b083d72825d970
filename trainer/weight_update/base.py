"""The weight-update seam: how one policy version's weights reach one vLLM backend.

The swap coordinator (`trainer/swap/coordinator.py`) drives every update through the same calls,
in the same order and the same routing states, whatever carries the weights:

    stage(backend)     ship the weights and prepare them aside while the backend still serves;
                       the served weights are not touched (the coordinator may take the backend
                       out of routing around it when another one serves)
    apply(backend)     inside the pause: make the prepared weights the served ones; keep it short
    verify(backend, model, version)   the served probe scores of `version` (the coordinator
                       compares them with the reference forward pass: parity)
    commit(backend)    parity passed: forget the old weights
    rollback(backend)  parity failed: put the old weights back exactly

What an update ships is `kind` (the method, and for files the payload: "delta", "full") and
`nbytes` (the payload's size); `relative` says it applies only on top of the plan's parent
version (a delta), so a backend serving another version gets the plan's fallback instead (full
weights). Which update each backend gets is the plan's choice (`SwapPlan.update_for`), never a
string compared in the coordinator.

Errors: `ControlError` means the backend answered no and says where its weights are: from stage,
nothing changed; from apply, it put the old weights back itself; from rollback, it could not.
Any transport error (`httpx.HTTPError`) from stage is a refusal too (stage touches nothing);
from apply, commit or rollback it leaves the weights unknown, and the backend `failed`.

Implementations: `files.py` (`DeltaFile`, `FullFile`: safetensors in HF naming, read from a path
by the project's worker extension) and `lora.py` (`LoraAdapter(adapter_dir, model, version)`,
kind "lora", not relative: a peft adapter folder loaded with `/v1/load_lora_adapter` under the
versioned name `served_name(model, version)`, `"tiny@v3"`, the base name for version 0; `commit`
unloads the model's other adapters, `rollback` the new one; the gateway sends a LoRA model's
traffic under its backend's served name, `rlgw/adapters.py`). The next ones fit without
touching the coordinator:

- **Files over HTTP** (`RemoteFile(url, sha256, token)`, a `FileUpdate` with the stored file's
  kind, for a backend on another host). Only `stage` differs: `rlgw_stage_url` makes the worker
  download the version file from an authenticated endpoint (a bearer token scoped to version
  files, never the admin key), check its sha256 against `policy_versions.checksum` before reading
  a tensor, then prepare it as `rlgw_stage` does; `nbytes` is the download. Apply, commit and
  rollback are the file ones, and the network time stays outside the pause.
- **vLLM's native weight-transfer engine** (`NcclTransfer(group, weights)`, kind "nccl", GPUs
  only; `--weight-transfer-config '{"backend": "nccl"}'`, trainer side
  `vllm.distributed.weight_transfer`). `/init_weight_transfer_engine` once per backend joins the
  trainer to the group. vLLM writes into the served parameters as the tensors arrive, so there is
  nothing to prepare aside: `stage` checks names, shapes and dtypes against the checkpoint and
  gathers the tensors to send; `apply` is `/start_weight_update`, `/update_weights` while the
  trainer broadcasts, `/finish_weight_update` (the transfer is the pause). vLLM keeps no copy of
  the old weights: `rollback` sends the parent weights again (the trainer holds them), or raises
  `ControlError` so that the backend stays out of routing; `commit` frees the trainer's copy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from trainer.parity import ProbeScores, served_scores
from trainer.vllm_control import VllmControl


@dataclass(frozen=True)
class Staged:
    """What a backend reported for a staged update."""

    nbytes: int  # bytes the backend received and prepared (summed over its workers)
    detail: Any = None  # the backend's own report (per-worker phases and counts), for logs


class WeightUpdate(ABC):
    """One version's weights for one backend, in one method: stage -> apply -> verify ->
    commit | rollback. Shared by every backend of a plan, so it keeps no per-backend state."""

    kind: ClassVar[str]  # what it ships: "delta", "full", "lora" (later "nccl")
    relative: ClassVar[bool]  # True: applies only to a backend serving the plan's parent version

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Size of the payload in bytes."""

    @abstractmethod
    def stage(self, backend: VllmControl) -> Staged:
        """Ship and prepare the update while the backend serves; the served weights stay."""

    @abstractmethod
    def apply(self, backend: VllmControl) -> Any:
        """Inside the pause: serve the staged weights; returns the backend's report."""

    def served_name(self, model_name: str, version: int | None) -> str:
        """The model name a backend serves `version` under after this update."""
        return model_name

    def verify(self, backend: VllmControl, model_name: str, version: int | None) -> ProbeScores:
        """The probe's served scores of `version` (the new one, or the old after a rollback)."""
        return served_scores(backend.http, backend.url, self.served_name(model_name, version))

    @abstractmethod
    def commit(self, backend: VllmControl) -> None:
        """Parity passed: drop the old weights (or keep their memory for the next stage)."""

    @abstractmethod
    def rollback(self, backend: VllmControl) -> None:
        """Parity failed: restore the weights from before `apply`, exactly."""
