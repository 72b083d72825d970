"""The worker extension's stage -> apply -> checksum, without vLLM: a tiny model with a fused q/k/v
parameter and its own `load_weights` stands in for vLLM's, so that the deltas the trainer writes
(unchanged tensors left out, bf16) are applied by the real rlgw_vllm code and checksummed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlgw_vllm.extension import WeightUpdateExtension
from trainer.models.weights import adopt_delta, apply_delta, delta, read_update, write_update

H = 8  # hidden size
QKV = ("q_proj", "k_proj", "v_proj")


class FusedLM(torch.nn.Module):
    """vLLM's layout in miniature: q, k and v live in one fused parameter; `load_weights` takes
    Hugging Face names, writes each into its slice of the parameter's current data, and reports
    the parameters it loaded (as vLLM's models do)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(16, H))
        self.qkv = torch.nn.Parameter(torch.randn(3 * H, H))
        self.o_proj = torch.nn.Parameter(torch.randn(H, H))
        self.norm = torch.nn.Parameter(torch.ones(H))

    def load_weights(self, weights) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            short = name.split(".")[-2]
            if short in QKV:
                start = QKV.index(short) * H
                params["qkv"].data[start : start + H].copy_(tensor)
                loaded.add("qkv")
            else:
                params[short].data.copy_(tensor)
                loaded.add(short)
        return loaded


def hf_weights(model: FusedLM) -> dict[str, torch.Tensor]:
    """The same weights in Hugging Face naming, as the trainer's reference holds them."""
    q, k, v = model.qkv.detach().split(H)
    return {
        "model.embed.weight": model.embed.detach().clone(),
        "model.q_proj.weight": q.clone(),
        "model.k_proj.weight": k.clone(),
        "model.v_proj.weight": v.clone(),
        "model.o_proj.weight": model.o_proj.detach().clone(),
        "model.norm.weight": model.norm.detach().clone(),
    }


class FakeWorker(WeightUpdateExtension):
    """The extension on a worker with no vLLM: no CPU packed GEMMs to find or rebuild."""

    def __init__(self, model: FusedLM) -> None:
        self.model_runner = SimpleNamespace(get_model=lambda: model)
        self._rlgw_expected = {k: tuple(v.shape) for k, v in hf_weights(model).items()}

    def _rlgw_gemm_modules(self, names: set[str]) -> list[torch.nn.Module]:
        return []

    def _rlgw_repack(self, modules: list[torch.nn.Module]) -> None:
        assert not modules

    def _rlgw_pack_aside(self, modules, new_data):
        assert not modules
        return []


def served_after(parent: FusedLM, path: Path, kind: str) -> str:
    """rlgw_checksum of a worker serving `parent` after it staged and applied the file."""
    worker = FakeWorker(parent)
    staged = worker.rlgw_stage(str(path), kind)
    assert staged["ok"], staged
    assert worker.rlgw_apply()["ok"]
    worker.rlgw_commit()
    return worker.rlgw_checksum()


def reference_pair(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(served, new) in HF naming: a step that changes q and o only (k, v, embed, norm stay)."""
    torch.manual_seed(seed)
    served = hf_weights(FusedLM())
    new = {k: v.clone() for k, v in served.items()}
    new["model.q_proj.weight"] += 1e-3 * torch.randn(H, H)
    new["model.o_proj.weight"] += 1e-3 * torch.randn(H, H)
    return served, new


def worker_model(weights: dict[str, torch.Tensor]) -> FusedLM:
    model = FusedLM()
    model.load_weights(weights.items())
    return model


@pytest.fixture(params=["swap", "inplace"])
def apply_mode(request, monkeypatch) -> str:
    monkeypatch.setenv("RLGW_STAGE_BACKGROUND", "0")  # stage inside the call
    monkeypatch.setenv("RLGW_WEIGHT_APPLY", request.param)
    return request.param


def test_a_delta_without_its_unchanged_tensors_serves_the_same_weights(tmp_path, apply_mode):
    served, new = reference_pair(0)
    sparse = delta(new, served)
    assert set(sparse) == {"model.q_proj.weight", "model.o_proj.weight"}
    dense = {name: new[name] - served[name] for name in served}  # zeros for the unchanged
    write_update(sparse, tmp_path / "sparse.safetensors")
    write_update(dense, tmp_path / "dense.safetensors")

    with_sparse = served_after(worker_model(served), tmp_path / "sparse.safetensors", "delta")
    with_dense = served_after(worker_model(served), tmp_path / "dense.safetensors", "delta")
    assert with_sparse == with_dense
    assert with_sparse != FakeWorker(worker_model(served)).rlgw_checksum()  # it did change


def test_a_bf16_delta_serves_exactly_the_adopted_reference(tmp_path, apply_mode):
    served, new = reference_pair(1)
    update = delta(new, served, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in update.values())
    write_update(update, tmp_path / "delta.safetensors")

    adopted = HfModule(new)  # the trainer's reference, holding theta_new
    adopt_delta(adopted, served, update)
    assert not torch.equal(adopted.weights()["model.q_proj.weight"], new["model.q_proj.weight"])
    write_update(adopted.weights(), tmp_path / "full.safetensors")

    applied = served_after(worker_model(served), tmp_path / "delta.safetensors", "delta")
    expected = served_after(worker_model(served), tmp_path / "full.safetensors", "full")
    assert applied == expected


class HfModule(torch.nn.Module):
    """A module whose parameters are named like a checkpoint (dots become '__' for torch)."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.clone()) for k, v in weights.items()}
        )

    def named_parameters(self, *args, **kwargs):
        for name, param in self.params.items():
            yield name.replace("__", "."), param

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.named_parameters()}


def test_the_adopted_reference_is_what_replaying_the_file_rebuilds(tmp_path):
    served, new = reference_pair(2)
    update = delta(new, served, torch.bfloat16)
    path = tmp_path / "delta.safetensors"
    write_update(update, path)

    adopted = HfModule(new)
    adopt_delta(adopted, served, update)
    rebuilt = HfModule(served)  # materialize: the parent, then the version's file
    apply_delta(rebuilt, read_update(path))
    for name, value in adopted.weights().items():
        assert torch.equal(value, rebuilt.weights()[name]), name
