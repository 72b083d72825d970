"""Read a safetensors file without holding the GIL for long and without copying it: what a
backend's background stage uses instead of safetensors' `load_file`.

`load_file` copies each tensor out of a memory map inside one call that keeps the GIL (for the
544 MB embedding of bench-0.5b the engine loop's thread cannot start a forward step until the copy
is done), into 1.4 GB of fresh memory whose page faults compete with the forward passes: the
slowest requests during a stage overlapped this read (docs/benchmarks.md). Here the file is first
read through with plain reads (which release the GIL during each system call), so that its pages
are in the page cache, then mapped copy-on-write, and each tensor is a view of the map: nothing is
copied and no new memory is faulted in; `load_weights` later copies from the map into the
scratch tensors.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}, then the data, offsets relative to its start. Every entry is checked against the file's
size and its shape and dtype before a tensor is made; a bad file is a ValueError.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct

import torch

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
SLICE_BYTES = 16 * 2**20  # bytes per read while paging the file in
MAX_HEADER_BYTES = 100 * 2**20  # the format's own limit on the JSON header


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def read_header(f, file_size: int) -> tuple[dict[str, dict], int]:
    """The header's tensor entries, checked, and where the data starts."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError("not a safetensors file: shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", raw)
    if length > min(MAX_HEADER_BYTES, file_size - 8):
        raise ValueError(f"not a safetensors file: a header of {length} bytes")
    try:
        header = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file: its header is not a JSON object")
    header.pop("__metadata__", None)
    start = 8 + length
    for name, entry in header.items():
        _check_entry(name, entry, file_size - start)
    return header, start


def _check_entry(name: str, entry: object, data_size: int) -> None:
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        raise ValueError(f"tensor {name!r}: unknown or missing dtype")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_size
    ):
        raise ValueError(f"tensor {name!r}: data offsets {offsets!r} outside the file")
    if offsets[1] - offsets[0] != math.prod(shape) * _itemsize(DTYPES[entry["dtype"]]):
        raise ValueError(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape}")


def page_in(path: str, slice_bytes: int = SLICE_BYTES) -> None:
    """Read the file through once with plain reads (the GIL released during each), so that
    mapping it later faults in nothing from disk."""
    buffer = bytearray(slice_bytes)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


class MappedTensors(dict):
    """read_tensors' answer: the tensors by name, views of `mapping` (None when nothing is
    mapped)."""

    mapping: mmap.mmap | None = None

    def drop_pages(self, slice_bytes: int = SLICE_BYTES) -> None:
        """Give the map's pages back a slice at a time (MADV_DONTNEED), before the map goes with
        the last tensor, so that no single call frees the whole 1.4 GB while forward steps run
        (its effect on the stall was within the benchmark's noise). The tensors stay valid (a
        page read again comes back from the file); do it when they are no longer needed."""
        mapping = self.mapping
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        for start in range(0, len(mapping), slice_bytes):
            mapping.madvise(mmap.MADV_DONTNEED, start, min(slice_bytes, len(mapping) - start))


def read_tensors(path: str) -> MappedTensors:
    """Every tensor of the safetensors file at `path` (equal to what `load_file` gives), as views
    of a private copy-on-write map of the file (writing to one never reaches the file). The map
    lives as long as one of the tensors does."""
    page_in(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, start = read_header(f, size)
        tensors = MappedTensors()
        if size == start:  # nothing to map (no tensor, or only empty ones)
            data = torch.empty(0, dtype=torch.uint8)
        else:
            tensors.mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            data = torch.frombuffer(tensors.mapping, dtype=torch.uint8)
    for name, entry in header.items():
        begin, end = (start + offset for offset in entry["data_offsets"])
        dtype = DTYPES[entry["dtype"]]
        raw = data[begin:end]
        if begin % _itemsize(dtype):
            raw = raw.clone()  # misaligned for its dtype (the format does not promise alignment)
        tensors[name] = raw.view(dtype).reshape(entry["shape"])
    return tensors
