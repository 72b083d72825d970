"""The trainer's half of the native weight transfer on a GPU, without vLLM: pack and broadcast.

For the GPU box (no vLLM there): a Qwen2-shaped model's weights, as `NcclTransfer` sends them
(`trainer/weight_update/packing.py`: bf16, the trainer's parameter order, cut into buckets of
vLLM's default 1 GiB), are packed into flat byte buffers and broadcast from rank 0 over a
one-process torch.distributed group (nccl on a GPU; gloo with --device cpu, which the test
runs), then unpacked from the metadata alone and compared bit for bit. A one-process broadcast
moves no bytes between GPUs: this checks that NCCL takes the packed buffers and that the
packing round-trips, and times the trainer's side (cast, pack, unpack); it is not a
bandwidth figure between a trainer and a vLLM server.

    python bench/weight_transfer_check.py --device cuda          # on the GPU box
    python bench/weight_transfer_check.py --device cpu --quick   # here
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlgw.ports import free_port  # noqa: E402
from trainer.models.byte_model import ModelShape  # noqa: E402
from trainer.models.model_families import FAMILIES, build_config, build_model  # noqa: E402
from trainer.models.weights import state_dict  # noqa: E402
from trainer.weight_update.packing import buckets, metadata, pack, unpack, wire_tensors  # noqa: E402

BUFFER_BYTES = 1 << 30  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES
SHAPES = {  # (shape, vocab): Qwen2.5-0.5B's, and tiny ones for the CPU
    "0.5b": (ModelShape(896, 24, 14, 2, 4864, 32768), 151_936),
    "quick": (ModelShape(64, 2, 1, 1, 128, 512), 512),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def transfer_check(device: torch.device, size: str, buffer_bytes: int = BUFFER_BYTES) -> dict:
    """Pack, broadcast, unpack and compare one model's weights; timings and sizes."""
    import torch.distributed as dist

    shape, vocab = SHAPES[size]
    family = FAMILIES["qwen2"]
    config = build_config(family, shape, vocab, {"bos": None, "eos": vocab - 2, "pad": vocab - 1})
    weights = state_dict(build_model(family, config, 0, device=str(device), redraw=False))
    own_group = not dist.is_initialized()
    if own_group:  # world size 1, in this process
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None
        )
    try:
        sync(device)
        t0 = time.perf_counter()
        wire = wire_tensors(weights, list(weights), torch.bfloat16, device)
        sync(device)
        cast_s = time.perf_counter() - t0
        pack_s = broadcast_s = unpack_s = 0.0
        same = True
        plan = buckets(metadata(wire), buffer_bytes)
        for bucket in plan:
            t0 = time.perf_counter()
            packed = pack([wire[m.name] for m in bucket])
            sync(device)
            t1 = time.perf_counter()
            dist.broadcast(packed, src=0)
            sync(device)
            t2 = time.perf_counter()
            received = unpack(packed, bucket)
            same &= all(torch.equal(received[m.name], wire[m.name]) for m in bucket)
            sync(device)
            pack_s, broadcast_s = pack_s + t1 - t0, broadcast_s + t2 - t1
            unpack_s += time.perf_counter() - t2
        nbytes = sum(t.numel() * t.element_size() for t in wire.values())
        return {
            "backend": dist.get_backend(),
            "model": size,
            "tensors": len(wire),
            "bytes": nbytes,
            "buckets": len(plan),
            "buffer_bytes": buffer_bytes,
            "bitwise_equal": bool(same),
            "cast_s": cast_s,
            "pack_s": pack_s,
            "broadcast_s": broadcast_s,
            "unpack_s": unpack_s,
            "pack_gb_per_s": nbytes / pack_s / 1e9 if pack_s else None,
        }
    finally:
        if own_group:
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes")
    parser.add_argument("--buffer-bytes", type=int, default=BUFFER_BYTES)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device (use --device cpu --quick)")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    report = transfer_check(device, "quick" if args.quick else "0.5b", args.buffer_bytes)
    print(json.dumps(report, indent=2))
    return 0 if report["bitwise_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
