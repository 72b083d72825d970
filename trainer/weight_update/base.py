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
`WeightsUnknown` (from apply) means the update broke part-way and nothing was put back.
Any transport error (`httpx.HTTPError`) from stage is a refusal too (stage touches nothing);
from apply, commit or rollback it leaves the weights unknown, and the backend `failed`.

Implementations: `files.py` (`DeltaFile`, `FullFile`: safetensors in HF naming, read from a path
by the project's worker extension), `remote.py` (`RemoteDelta`, `RemoteFull`: the same files,
fetched over HTTP by a backend that cannot read the path; `RemoteLora`: a LoRA version's adapter
folder likewise) and `lora.py` (`LoraAdapter(adapter_dir,
model, version)`, kind "lora", not relative: a peft adapter folder loaded with
`/v1/load_lora_adapter` under the versioned name `served_name(model, version)`, `"tiny@v3"`, the
base name for version 0, at stage, outside the pause: nobody calls that name until routing moves
to it, so `apply` has nothing left to do; `commit` unloads the model's other adapters, `rollback`
the new one; the gateway sends a LoRA model's traffic under its backend's served name,
`rlgw/adapters.py`):

- **Files over HTTP** (done: `remote.py`, `RemoteDelta`/`RemoteFull(path, url, sha256, token)`,
  the file updates with another stage, for a backend on another host). `rlgw_stage_url` makes
  the worker read the trainer's path when that file is on its host with the version's sha256,
  and otherwise download it from the trainer's version-file server
  (`trainer/publishing/version_files.py`: a bearer token scoped to version files, never the admin
  key; Range, so a download resumes), check its sha256 against `policy_versions.checksum` before
  reading a tensor, then prepare it as `rlgw_stage` does; `Staged.note` says which delivery and why.
  Apply, commit and rollback are the file ones, and the network time stays outside the pause.
  `RemoteLora(adapter_dir, model, version, config=, weights=, token=)` does the same for a LoRA
  version: `rlgw_fetch_adapter` gives the worker the trainer's folder when both files are on its
  host with their sha256s, and otherwise downloads and verifies both (the weights against
  `policy_versions.checksum`, the config against the sha256 the publisher took) into a folder of its
  own, which the stage then loads with `/v1/load_lora_adapter`; apply, verify, commit and rollback
  are `LoraAdapter`'s. The publisher offers updates this way when `RLGW_VERSION_FILES_BIND` is set
  (docs/deployment.md).
- **vLLM's native weight-transfer engine**, implemented, EXPERIMENTAL (never run against a GPU
  vLLM server): `nccl.py` (`NcclTransfer`, `IpcTransfer`, kind "nccl"/"ipc", full weights, not
  relative; server flag `--weight-transfer-config '{"backend": "nccl"}'`, trainer side
  `vllm.distributed.weight_transfer`). It is a plan's `preferred` update, offered only with
  RLGW_WEIGHT_TRANSFER=nccl|ipc; `unusable_on(backend)` says why a backend cannot take it (a
  probe of its `/server_info`), and that backend gets the plan's files instead. The rendezvous
  (`/init_weight_transfer_engine`, once per backend) and the checks are in `stage`; `apply` is
  one round (`/start_weight_update`, `/update_weights` while the trainer broadcasts,
  `/finish_weight_update`: the transfer is the pause, and a round broken after its start raises
  `WeightsUnknown`: the backend goes `failed`); vLLM keeps no copy of the old weights, so
  `rollback` sends the parent's weights again, or raises `ControlError` without them.
  docs/deployment.md has the flags and what is tested.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from trainer.backends.parity import ProbeScores, served_scores
from trainer.backends.vllm_control import VllmControl


class WeightsUnknown(RuntimeError):
    """An update failed part-way and could not be undone: the backend serves neither the old
    weights nor the new ones (it must stay out of routing until weights are pushed again)."""


@dataclass(frozen=True)
class Staged:
    """What a backend reported for a staged update."""

    nbytes: int  # bytes the backend received and prepared (summed over its workers)
    detail: Any = None  # the backend's own report (per-worker phases and counts), for logs
    note: str | None = None  # how it travelled, when the backend chose (e.g. HTTP, and why)


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

    def unusable_on(self, backend: VllmControl) -> str | None:
        """Why this update cannot go to `backend` (the plan then gives it its files instead);
        None when it can. Only an update that depends on how the backend was started (vLLM's
        native weight transfer) says anything here."""
        return None

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
