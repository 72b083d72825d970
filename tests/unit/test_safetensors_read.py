"""The stage's safetensors reader gives what load_file gives, and refuses bad files."""

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlgw_vllm.safetensors_read import read_tensors


@pytest.fixture
def saved(tmp_path):
    tensors = {
        "embed": torch.randn(300, 7),
        "half": torch.randn(5, 3).to(torch.bfloat16),
        "f16": torch.randn(4).to(torch.float16),
        "ids": torch.arange(10, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    path = tmp_path / "update.safetensors"
    save_file(tensors, str(path), metadata={"version": "3"})
    return path


def test_every_tensor_is_read_bitwise_as_load_file_reads_it(saved):
    ours, theirs = read_tensors(str(saved)), load_file(str(saved))
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        assert torch.equal(ours[name], tensor), name


def test_the_tensors_map_the_file_and_writing_one_never_reaches_it(saved):
    tensors = read_tensors(str(saved))
    size = saved.stat().st_size
    assert tensors["embed"].untyped_storage().nbytes() == size  # a view of the map, no copy
    tensors["embed"].fill_(7.0)  # copy-on-write: the file keeps its bytes
    assert not torch.equal(load_file(str(saved))["embed"], tensors["embed"])
    assert torch.equal(read_tensors(str(saved))["embed"], load_file(str(saved))["embed"])


def test_the_tensors_stay_valid_after_their_pages_are_given_back(saved):
    tensors = read_tensors(str(saved))
    tensors.drop_pages(slice_bytes=4096)
    expected = load_file(str(saved))
    assert all(torch.equal(tensors[name], expected[name]) for name in expected)


def test_a_tensor_misaligned_for_its_dtype_is_copied_out_whole(tmp_path):
    half, single = torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([2.25, -3.0])
    header = {
        "h": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
        "s": {"dtype": "F32", "shape": [2], "data_offsets": [2, 10]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-aligned, "s" 2 bytes past that
    data = half.view(torch.uint8).numpy().tobytes() + single.numpy().tobytes()
    tensors = read_tensors(_write(tmp_path / "odd.safetensors", raw, data))
    assert torch.equal(tensors["h"], half) and torch.equal(tensors["s"], single)


def _write(path, header: bytes, data: bytes = b"") -> str:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        (b"not json", b"", "not JSON"),
        (b"[1, 2]", b"", "not a JSON object"),
        (json.dumps({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}), 4, "dtype"),
        (json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), 4, "outside"),
        (json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}), 8, "bytes"),
        (json.dumps({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}), 4, "shape"),
    ],
)
def test_a_malformed_file_is_refused_with_the_reason(tmp_path, header, data, message):
    raw = header.encode() if isinstance(header, str) else header
    path = _write(tmp_path / "bad.safetensors", raw, bytes(data) if isinstance(data, int) else data)
    with pytest.raises(ValueError, match=message):
        read_tensors(path)


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x10\x00")
    with pytest.raises(ValueError, match="shorter"):
        read_tensors(str(path))
    header = b"x" * 64
    path.write_bytes(struct.pack("<Q", 10_000) + header)
    with pytest.raises(ValueError, match="header of 10000 bytes"):
        read_tensors(str(path))
