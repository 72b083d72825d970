"""The trainer warns once when bf16 is asked for on a CPU that only emulates it (no AVX-512 BF16,
no AMX): there a bench-0.5b update step took minutes where fp32 took seconds."""

from __future__ import annotations

import torch

from trainer.loop.device import cpu_flags, slow_bf16_warning

CPU = torch.device("cpu")


def test_bf16_on_a_cpu_without_native_bf16_is_warned_about():
    warning = slow_bf16_warning(CPU, "bfloat16", frozenset({"avx2", "fma"}))
    assert warning is not None and "--dtype float32" in warning


def test_no_warning_where_bf16_is_native_or_not_asked_for():
    assert slow_bf16_warning(CPU, "bfloat16", frozenset({"avx512f", "avx512_bf16"})) is None
    assert slow_bf16_warning(CPU, "bfloat16", frozenset({"amx_bf16"})) is None
    assert slow_bf16_warning(CPU, "float32", frozenset({"avx2"})) is None
    assert slow_bf16_warning(torch.device("cuda", 0), "bfloat16", frozenset()) is None


def test_this_machines_flags_are_read():
    flags = cpu_flags()
    assert flags is None or "fpu" in flags  # every x86 CPU lists fpu; None off Linux
