"""The CPU build's packed GEMM copies of linear layers (oneDNN / SGL): finding the layers an
update touches, packing new weights aside without touching what serves, repacking in place."""

from __future__ import annotations

import torch

from .served import ServedModel, is_cpu
from .updates import MISSING, ModuleState


class PackingShadow:
    """Stands in for a linear layer while vLLM's CPU GEMM dispatch packs its new weights: the
    dispatch reads `weight` and `bias` and sets `cpu_linear` (and may convert the bias, or keep
    an unpacked copy) on this object, never on the layer that serves."""

    def __init__(
        self, module: torch.nn.Module, by_id: dict[int, str], new_data: dict[str, torch.Tensor]
    ) -> None:
        for attr in ("weight", "bias"):
            param = getattr(module, attr, None)
            if param is not None:
                data = new_data.get(by_id.get(id(param), ""), param.data)
                param = torch.nn.Parameter(data, requires_grad=False)
            setattr(self, attr, param)

    def state(
        self, module: torch.nn.Module, by_id: dict[int, str], new_data: dict[str, torch.Tensor]
    ) -> ModuleState:
        """What the dispatch set, as a change of `module`; the new tensors it converted (a bias to
        fp32, say) replace theirs in `new_data`."""
        for attr in ("weight", "bias"):
            name = by_id.get(id(getattr(module, attr, None)), "")
            if name in new_data:
                new_data[name] = getattr(self, attr).data
        new = {k: v for k, v in vars(self).items() if k not in ("weight", "bias")}
        old = {k: module.__dict__.get(k, MISSING) for k in new}
        return ModuleState(module, old, new)


class Packing(ServedModel):
    def _rlgw_gemm_modules(self, names: set[str]) -> list[torch.nn.Module]:
        """Modules with a CPU packed GEMM that own one of the named parameters. A tied lm_head
        shares the embedding's parameter but has its own packed copy: it is found by identity."""
        if not is_cpu():
            return []
        params = self._rlgw_params()
        wanted = {id(params[n]) for n in names if n in params}
        found = []
        for module in self._rlgw_model().modules():
            if not hasattr(module, "cpu_linear") or getattr(module, "weight", None) is None:
                continue
            if any(id(p) in wanted for p in module.parameters(recurse=False)):
                found.append(module)
        return found

    def _rlgw_repack(self, modules: list[torch.nn.Module]) -> None:
        """Rebuild the CPU build's packed copies of these layers' weights from their data."""
        from vllm.model_executor.layers import utils

        for module in modules:
            utils.dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    @torch.no_grad()
    def _rlgw_pack_aside(
        self, modules: list[torch.nn.Module], new_data: dict[str, torch.Tensor]
    ) -> list[ModuleState]:
        """Pack new weights for these modules without touching what they serve: each module's
        dispatch runs on a stand-in (`PackingShadow`) that holds the new tensors, so the served
        module is never changed and forward steps go on meanwhile (no serving lock)."""
        from vllm.model_executor.layers import utils

        by_id = {id(p): name for name, p in self._rlgw_params().items()}
        states = []
        for module in modules:
            shadow = PackingShadow(module, by_id, new_data)
            utils.dispatch_cpu_unquantized_gemm(shadow, remove_weight=False)
            states.append(shadow.state(module, by_id, new_data))
        return states

    @staticmethod
    def _rlgw_set_attrs(states: list[ModuleState], which: str) -> None:
        for state in states:
            for key, value in getattr(state, which).items():
                if value is MISSING:
                    state.module.__dict__.pop(key, None)
                else:
                    state.module.__dict__[key] = value
