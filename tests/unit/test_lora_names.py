"""The names a LoRA-trained model is served under: version N is the adapter `model@vN`, the base
(and every version of a full-weight model) the model's own name; the client sees its own name."""

from __future__ import annotations

import pytest

from gateway.proxy.routing import BackendView
from gateway.proxy.shaping import shown_as
from rlgw.adapters import LoraSpec, max_lora_rank, served_name


def test_a_lora_version_is_served_as_its_adapter_and_the_base_as_the_model() -> None:
    assert served_name("tiny", 3, lora=True) == "tiny@v3"
    assert served_name("tiny", 0, lora=True) == "tiny"
    assert served_name("tiny", 3, lora=False) == "tiny"


def test_the_gateway_sends_a_backend_of_a_lora_model_its_versions_adapter() -> None:
    view = BackendView(1, "tiny", "http://b", "active", 3, 0, lora=True)
    assert view.served_name == "tiny@v3"
    view.hear("active", 4, 1)  # a swap moved it on
    assert view.served_name == "tiny@v4"
    assert BackendView(2, "tiny", "http://c", "active", 3, 0).served_name == "tiny"


def test_a_reply_names_the_model_the_client_asked_for() -> None:
    payload = {"id": "x", "model": "tiny@v3", "choices": []}
    shown_as(payload, "tiny")
    assert payload["model"] == "tiny"


def test_the_rank_is_rounded_up_to_one_vllm_accepts_and_bad_settings_are_refused() -> None:
    assert [max_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="above"):
        max_lora_rank(1000)
    with pytest.raises(ValueError, match="rank"):
        LoraSpec(0, 1.0)
    spec = LoraSpec(8, 16.0, ("q_proj", "v_proj"))
    assert LoraSpec.from_json(spec.as_json()) == spec and LoraSpec.from_json(None) is None
