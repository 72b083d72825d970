"""Full weights streamed into a GPU backend by vLLM's native weight-transfer engine (NCCL, IPC).

EXPERIMENTAL: this path has never run against a real GPU vLLM server (no GPU build of vLLM can
run on the project's machines). It follows vLLM 0.32's documented trainer-side API
(`trainer/weight_update/vllm_engines.py`); what runs without a GPU is tested: the selection and
its fallback reasons, the tensors and metadata the trainer sends, the request sequence, the
rollback. Never the default: the publisher offers it only with RLGW_WEIGHT_TRANSFER=nccl|ipc,
and the swap takes it only where `unusable_on` finds nothing missing (both sides on CUDA, the
backend started with the matching --weight-transfer-config); elsewhere the plan's files go,
with the reason in the log and in the swap report.

The seam's calls (`base.py`):

    stage     check the names, shapes and values against the checkpoint the backend was
              launched with; open the link (the rendezvous, once per backend); cast the
              weights to the served dtype on the trainer's GPU, in the trainer's parameter
              order (embeddings, then one decoder layer after another, as vLLM's own
              `ModuleSource` iterates). The served weights are not touched.
    apply     one round, inside the pause: /start_weight_update, /update_weights while the
              trainer broadcasts, /finish_weight_update. vLLM writes into the served
              parameters as the tensors arrive (its layerwise reload), so the transfer IS the
              pause, and a round that fails after its start leaves weights that are neither
              version: WeightsUnknown, the backend goes `failed`.
    rollback  vLLM keeps no copy of the old weights: the parent version's full weights are
              sent again (the publisher rebuilds them from the version files when asked), or,
              without them, ControlError: the backend stays out of routing.
    commit    nothing to drop on the backend; the link stays open for the next version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from rlgw.weight_files import validate_update
from trainer.backends.vllm_control import ControlError, VllmControl

from .base import Staged, WeightsUnknown, WeightUpdate
from .packing import buckets, metadata, wire_tensors
from .transfer_links import TransferLinks

PACKED_BUFFER_BYTES = 1 << 30  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES (the NCCL engine packs)


class NativeTransfer(WeightUpdate):
    """One version's full weights for vLLM's weight-transfer engine `method`."""

    method: ClassVar[str]
    relative = False  # full weights: installs the version whatever the backend served

    def __init__(
        self,
        links: TransferLinks,
        weights: dict[str, torch.Tensor],
        *,
        expected: dict[str, tuple[int, ...]],
        parent: Callable[[], dict[str, torch.Tensor]] | None = None,
    ) -> None:
        if links.method != self.method:
            raise ValueError(f"{type(self).__name__} needs {self.method} links, not {links.method}")
        self.links = links
        self.weights = weights  # by HF name, in the order they are sent
        self.expected = expected  # names and shapes of the checkpoint the backends launched with
        self.parent = parent  # the parent version's full weights, for a rollback
        self._wire: dict[tuple[str, torch.dtype], dict[str, torch.Tensor]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.weights)} tensors)"

    @property
    def nbytes(self) -> int:
        """Bytes on the wire in bf16 (how GPU backends serve); a stage reports the real size."""
        return sum(t.numel() for t in self.weights.values()) * torch.bfloat16.itemsize

    def unusable_on(self, backend: VllmControl) -> str | None:
        problems = self.links.problems(backend)
        return "; ".join(problems) if problems else None

    def wire(self, which: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The `which` ("new" or "parent") weights as they are sent to a backend in `dtype`."""
        key = (which, dtype)
        if key not in self._wire:
            weights = self.weights if which == "new" else self._parent_weights()
            self._wire[key] = wire_tensors(weights, list(self.weights), dtype, self.links.device)
            if self.links.device.type == "cuda":
                torch.cuda.synchronize(self.links.device)  # sent from another thread's streams
        return self._wire[key]

    def _parent_weights(self) -> dict[str, torch.Tensor]:
        if self.parent is None:
            raise ControlError(
                "vLLM keeps no copy of the old weights and this update holds no parent "
                "weights to send again: the backend stays out of routing"
            )
        return self.parent()

    # ------------------------------------------------------------------ the seam
    def stage(self, backend: VllmControl) -> Staged:
        problems = validate_update(self.weights, "full", self.expected)
        if problems:
            raise ControlError("; ".join(problems[:5]))
        link = self.links.link(backend)  # vLLM: WeightTransferTrainerFactory.trainer_init
        meta = metadata(self.wire("new", link.server.dtype))
        return Staged(
            sum(m.nbytes for m in meta),
            {
                "method": self.method,
                "dtype": str(link.server.dtype),
                "tensors": len(meta),
                "buckets": len(buckets(meta, PACKED_BUFFER_BYTES)),
                "workers": link.server.world_size,
            },
        )

    def apply(self, backend: VllmControl) -> None:
        link = self.links.link(backend)
        # vLLM: NCCLTrainerWeightTransferEngine.send_weights (nccl_engine.py), or
        # IPCTrainerWeightTransferEngine.send_weights (ipc_engine.py): start, update, finish
        self.links.send(link, self.wire("new", link.server.dtype))

    def commit(self, backend: VllmControl) -> None:
        return None  # vLLM holds one copy (the new one); the link stays open

    def rollback(self, backend: VllmControl) -> None:
        try:
            link = self.links.link(backend)
            self.links.send(link, self.wire("parent", link.server.dtype))
        except WeightsUnknown as exc:
            raise ControlError(f"the parent weights could not be sent again: {exc}") from exc


class NcclTransfer(NativeTransfer):
    """`--weight-transfer-config '{"backend": "nccl"}'`: a broadcast from the trainer's GPU to
    the backend's workers (another GPU, or another host)."""

    kind = "nccl"
    method = "nccl"


class IpcTransfer(NativeTransfer):
    """`--weight-transfer-config '{"backend": "ipc"}'`: CUDA IPC handles to the trainer's
    tensors, for a backend on the trainer's own GPU (colocated)."""

    kind = "ipc"
    method = "ipc"


NATIVE_TRANSFERS: dict[str, type[NativeTransfer]] = {
    cls.method: cls for cls in (NcclTransfer, IpcTransfer)
}
