"""bench/weight_sync_report.py: the three weight-sync benchmarks' results become one table, a row
per preset, method and dtype, with medians over the swaps and the worst stall."""

from __future__ import annotations

import json

from bench.weight_sync_report import swaps, table


def _swap(stage_s: float, stall_s: float, ok: bool = True) -> dict:
    return {
        "bytes_shipped": 1000,
        "stage_s": stage_s,
        "pause_ms": 40.0,
        "out_of_service_s": 0.5,
        "verify_s": 0.4,
        "slowest_request_during_stage_s": stall_s,
        "unloaded_latency_s": 0.2,
        "parity_ok": ok,
        "parity_max_diff": 3e-2,
        "tolerance": 9e-2,
    }


def test_the_three_results_make_one_row_per_method_and_dtype(tmp_path):
    full = {"preset": "bench-0.5b", "dtype": "bfloat16", "unloaded_latency_s": 0.25}
    full["swaps"] = [_swap(1.0, 0.3), _swap(3.0, 0.5), _swap(2.0, 0.4)]
    (tmp_path / "weight_sync.json").write_text(json.dumps({"results": [full]}))
    lora = [{**_swap(0.1, 0.2), "method": "lora-r8", "dtype": "float32"} for _ in range(2)]
    lora.append({**_swap(0.3, 0.9, ok=False), "method": "lora-r8", "dtype": "float32"})
    (tmp_path / "weight_sync_lora.json").write_text(
        json.dumps({"preset": "bench-0.5b", "rows": lora})
    )
    http = [{**_swap(2.5, 0.6), "method": m, "dtype": "float32"} for m in ("path", "http")]
    (tmp_path / "weight_sync_http.json").write_text(
        json.dumps({"preset": "bench-0.5b", "rows": http})
    )

    rows = swaps(tmp_path)
    assert len(rows) == 3 + 3 + 2
    lines = table(rows).splitlines()
    full_row = next(line for line in lines if "| delta-file | bfloat16 |" in line)
    cells = [c.strip() for c in full_row.strip("|").split("|")]
    assert cells[3] == "3/3"  # swaps accepted
    assert cells[5] == "2"  # stage: the median of 1, 3 and 2
    assert cells[9] == "0.5"  # slowest request: the worst of the three
    assert cells[10] == "0.25"  # the full benchmark's unloaded latency
    assert cells[11] == "2.0x"
    lora_row = next(line for line in lines if "| lora-r8 | float32 |" in line)
    assert "| 2/3 |" in lora_row  # a refused swap is counted, not hidden
    assert any("delta-file over HTTP" in line for line in lines)
    assert any("delta-file (path, beside HTTP)" in line for line in lines)
