"""The trainer's side of vLLM's native weight transfer: which tensors go, in what form and order,
and how a packed stream is cut (checked against vLLM's own packing code, which runs on a CPU)."""

from __future__ import annotations

import pytest
import torch
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor

from trainer.weight_update.packing import (
    buckets,
    metadata,
    pack,
    unpack,
    update_info,
    wire_tensors,
)


def checkpoint_like() -> dict[str, torch.Tensor]:
    """fp32 master weights by HF name, in module order (as `trainer.models.weights.state_dict`
    gives)."""
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (259, 64),
        "model.layers.0.self_attn.q_proj.weight": (64, 64),
        "model.layers.0.self_attn.q_proj.bias": (64,),
        "model.layers.0.mlp.down_proj.weight": (64, 128),
        "model.layers.1.self_attn.q_proj.weight": (64, 64),
        "model.norm.weight": (64,),
    }
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def test_wire_tensors_are_the_weights_in_bf16_in_the_order_asked():
    weights = checkpoint_like()
    order = list(weights)
    wire = wire_tensors(weights, order, torch.bfloat16, "cpu")
    assert list(wire) == order
    for name, tensor in wire.items():
        assert tensor.dtype == torch.bfloat16 and tensor.is_contiguous()
        assert torch.equal(tensor, weights[name].to(torch.bfloat16))  # round to nearest, once
    assert all(w.dtype == torch.float32 for w in weights.values())  # master weights untouched


def test_a_non_contiguous_weight_goes_out_contiguous_with_its_own_values():
    weights = {"w": torch.arange(12.0).reshape(3, 4).t()}  # a transposed view
    wire = wire_tensors(weights, ["w"], torch.bfloat16, "cpu")
    assert wire["w"].is_contiguous() and torch.equal(wire["w"].float(), weights["w"])


def test_update_info_is_what_vllms_nccl_worker_parses():
    wire = wire_tensors(checkpoint_like(), list(checkpoint_like()), torch.bfloat16, "cpu")
    info = update_info(metadata(wire))
    parsed = NCCLWeightTransferUpdateInfo(**info)  # the worker's own dataclass
    assert parsed.names == list(wire)
    assert parsed.dtype_names == ["bfloat16"] * len(wire)
    assert [getattr(torch, d) for d in parsed.dtype_names] == [torch.bfloat16] * len(wire)
    assert parsed.shapes == [list(t.shape) for t in wire.values()]


@pytest.mark.filterwarnings("ignore:Tensor .* exceeds buffer_size_bytes")  # vLLM's, expected
def test_buckets_are_cut_where_vllms_packer_cuts_them():
    wire = wire_tensors(checkpoint_like(), list(checkpoint_like()), torch.bfloat16, "cpu")
    meta = metadata(wire)
    for buffer_bytes in (1, 9_000, 20_000, 40_000, 1 << 30):
        ours = [[m.name for m in bucket] for bucket in buckets(meta, buffer_bytes)]
        theirs, items = [], iter(wire.items())
        while (chunk := pack_tensors(items, lambda item: item[1], buffer_bytes)) is not None:
            theirs.append(chunk.names)
        assert ours == theirs, buffer_bytes
    sizes = [sum(m.nbytes for m in b) for b in buckets(meta, 40_000)]
    assert sum(sizes) == sum(t.numel() * 2 for t in wire.values())  # bf16: 2 bytes a value


def test_a_packed_bucket_is_byte_for_byte_vllms_and_unpacks_from_the_metadata_alone():
    wire = wire_tensors(checkpoint_like(), list(checkpoint_like()), torch.bfloat16, "cpu")
    meta = metadata(wire)
    packed = pack(list(wire.values()))
    chunk = pack_tensors(iter(wire.items()), lambda item: item[1], 1 << 30)
    assert torch.equal(packed, chunk.packed_tensor)
    ours = unpack(packed, meta)
    theirs = unpack_tensor(
        chunk.packed_tensor,
        chunk.names,
        chunk.shapes,
        chunk.dtypes,
        chunk.tensor_sizes,
    )
    for (name, tensor), (their_name, their_tensor) in zip(ours.items(), theirs, strict=True):
        assert name == their_name
        assert torch.equal(tensor, wire[name]) and torch.equal(their_tensor, wire[name])
