"""LoRA on the trainer's side: only the adapter trains, a stored adapter rebuilds the version's
reference exactly, merging gives the same model, and a damaged adapter folder is refused."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from update_fixtures import random_samples, tiny_model

from trainer.backends.parity import reference_scores
from trainer.config import TrainerConfig
from trainer.loop.distributed import DistContext
from trainer.loop.policy import Policy
from trainer.models.lora import merged
from trainer.models.weights import state_dict
from trainer.weight_update.lora import CONFIG_FILE, LoraAdapter, sort_target_modules


def lora_policy(model: torch.nn.Module, **fields) -> Policy:
    config = TrainerConfig(lora_rank=4, lr=5e-2, max_tokens_per_sample=48, **fields)
    return Policy(model, config, DistContext(0, 1, 0, torch.device("cpu")))


def trained(tmp_path: Path) -> tuple[Policy, LoraAdapter]:
    policy = lora_policy(tiny_model())
    policy.update(random_samples(6))
    policy.weights()
    return policy, LoraAdapter.write(policy.reference, tmp_path / "v1-lora", "tiny", 1)


def test_a_new_adapter_computes_the_base_model() -> None:
    base = tiny_model()
    expected = reference_scores(base)
    assert reference_scores(lora_policy(base).reference).max_abs_diff(expected) == 0.0


def test_only_the_adapter_is_optimised_and_the_base_weights_stay(tmp_path: Path) -> None:
    base_before = {k: v.clone() for k, v in state_dict(tiny_model()).items()}
    policy, _ = trained(tmp_path)
    optimised = [p for group in policy.optimizer.param_groups for p in group["params"]]
    assert optimised and all(p.requires_grad for p in optimised)
    names = {n for n, p in policy.reference.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)
    base_after = {
        n.replace(".base_layer", ""): p
        for n, p in policy.reference.get_base_model().named_parameters()
        if "lora_" not in n
    }
    assert all(torch.equal(base_after[k], v) for k, v in base_before.items())
    assert reference_scores(policy.reference).max_abs_diff(reference_scores(tiny_model())) > 1e-3


def test_a_stored_adapter_rebuilds_the_reference_and_merges_to_it(tmp_path: Path) -> None:
    policy, adapter = trained(tmp_path)
    expected = reference_scores(policy.reference)
    rebuilt = adapter.load_onto(tiny_model())
    assert reference_scores(rebuilt).max_abs_diff(expected) == 0.0
    assert reference_scores(merged(rebuilt)).max_abs_diff(expected) < 1e-5
    assert adapter.name == "tiny@v1" and adapter.problems() == []
    assert adapter.nbytes < sum(v.numel() * 4 for v in state_dict(tiny_model()).values())


def test_an_adapter_with_non_finite_weights_is_refused(tmp_path: Path) -> None:
    _, adapter = trained(tmp_path)
    tensors = load_file(str(adapter.payload_file))
    first = next(iter(tensors))
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, str(adapter.payload_file))
    assert "NaN" in adapter.problems()[0]


def test_an_adapter_config_has_the_same_bytes_whatever_order_peft_listed_its_modules(
    tmp_path: Path,
) -> None:
    """peft writes `target_modules` in set order; the version's checksum covers this file."""
    _, adapter = trained(tmp_path)
    written = (Path(adapter.path) / CONFIG_FILE).read_text()
    config = json.loads(written)
    assert len(config["target_modules"]) > 1
    assert config["target_modules"] == sorted(config["target_modules"])
    reordered = tmp_path / CONFIG_FILE
    config["target_modules"] = sorted(config["target_modules"], reverse=True)
    reordered.write_text(json.dumps(config))
    sort_target_modules(reordered)
    assert reordered.read_text() == written
