"""An agent key's consent narrows its tenant's and never widens it."""

from __future__ import annotations

import pytest

from rlgw.governance.consent import Policy, narrowed


@pytest.mark.parametrize(
    ("tenant", "key", "effective"),
    [
        ("all", None, "all"),
        ("none", None, "none"),
        (["a", "b"], None, ["a", "b"]),
        ("all", ["b", "a"], ["a", "b"]),
        ("all", [], "none"),
        (["a", "b"], ["b", "c"], ["b"]),
        (["a"], ["c"], "none"),
        ("none", ["a"], "none"),
    ],
)
def test_a_key_narrows_its_tenants_consent(tenant, key, effective):
    assert narrowed(Policy("t", tenant, "tenant"), key) == effective
