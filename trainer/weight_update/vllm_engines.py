"""vLLM's trainer-side weight-transfer engines, opened the documented way (imports vLLM).

vLLM 0.32's trainer API (docs: training/weight_transfer; code: `vllm.distributed.weight_transfer`):
`WeightTransferTrainerFactory.trainer_init(init_info, client=, source=)` builds the engine the
init info's `backend` names and rendezvouses with the inference side (for NCCL it posts
`/init_weight_transfer_engine` with the workers' `NCCLWeightTransferInitInfo`, `rank_offset` 1,
while it opens rank 0 of the group itself); `engine.send_weights()` then replays the source
each round: `/start_weight_update`, `/update_weights` concurrently with the broadcast,
`/finish_weight_update` (`NCCLTrainerWeightTransferEngine.send_weights`; the IPC engine ships
CUDA IPC handles in `/update_weights` instead of broadcasting). Kept apart so that the rest of
the seam imports without vLLM (a trainer without it gets a fallback reason, not an ImportError).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from vllm.distributed.weight_transfer import (
    ParamMeta,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferTrainerFactory,
)

from rlgw.ports import free_port


class RoundSource(WeightSource):
    """The weights one round sends: set before each `send_weights` (the engine keeps the source
    it was opened with, so one source per backend link serves every version)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.tensors.items()


def open_engine(
    method: str, host: str, workers: int, client: VLLMWeightSyncClient, source: WeightSource
) -> TrainerWeightTransferEngine:
    """Rendezvous with a backend's `workers` and return the ready trainer engine (rank 0, the
    sender). NCCL: a TCPStore on `host` and a free port, group size 1 + workers."""
    if method == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(
            master_address=host, master_port=free_port(host), world_size=1 + workers, rank=0
        )
    elif method == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=0)
    else:
        raise ValueError(f"unknown weight-transfer method {method!r}")
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
