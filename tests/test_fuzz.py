"""Schemathesis over the gateway's whole OpenAPI spec, bounded to stay well under a minute:
no 5xx, no traceback in any body, nothing already recorded changes. tools/fuzz.py runs longer."""

from __future__ import annotations

import pytest

from fuzz_support import run_fuzz

EXAMPLES_PER_OPERATION_AND_MODE = 20


@pytest.mark.timeout(120)
def test_fuzzing_the_openapi_spec_finds_nothing(make_database):
    report = run_fuzz(make_database, max_examples=EXAMPLES_PER_OPERATION_AND_MODE, seed_value=0)
    print(report.summary())
    assert report.operations >= 20
    assert report.cases >= report.operations * 10
    assert report.failures == [], "\n".join(report.failures[:20])
    assert report.changed_rows == [], "\n".join(report.changed_rows[:20])
