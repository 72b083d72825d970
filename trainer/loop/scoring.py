"""How the trainer's model scores tokens: dropout off, and the LM head in fp32 under autocast.

vLLM never applies dropout, so the log-probs the update optimises must not either: a checkpoint
whose config asks for it (`attention_dropout`, `hidden_dropout`, ...) would otherwise train on
noisy log-probs as soon as `model.train()` runs (which gradient checkpointing in transformers
needs, so the model stays in train mode and its dropout is set to zero instead).

Under bf16 autocast the LM head's matmul would run in bf16 (8 significant bits) over a large
vocabulary; it runs in fp32 here (MiniMax-M1, 2025: an fp32 LM head closed the gap between training
and inference probabilities), and the log-softmax that follows is fp32 already
(`token_logprobs`). The rest of the forward stays in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PATCHED = "_rlgw_fp32_head"


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability of `model` to 0: nn.Dropout modules, the float `*dropout*`
    attributes attention modules copy from the config at init, and the config's own fields.
    Returns how many were nonzero."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            module.p, changed = 0.0, changed + 1
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float) and value:
                setattr(module, name, 0.0)
                changed += 1
    config = getattr(model, "config", None)
    if config is not None:
        for name, value in list(vars(config).items()):
            if "dropout" in name and isinstance(value, float) and value:
                setattr(config, name, 0.0)
                changed += 1
    return changed


def _fp32_head_forward(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.float()
        return F.linear(hidden.float(), self.weight.float(), bias)


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's LM head (inside a DDP wrapper too: `replicate_model`); None if it has none."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        model = model.module
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def fp32_head(model: torch.nn.Module) -> bool:
    """Make the LM head compute in fp32 under autocast (an instance-level forward: the module,
    its parameters and their names are unchanged, tied embeddings stay tied). Only a plain
    nn.Linear head is changed (a LoRA-wrapped head is left as it is); returns whether it is."""
    head = output_head(model)
    if type(head) is not torch.nn.Linear:
        return False
    if not getattr(head, _PATCHED, False):
        head.forward = _fp32_head_forward.__get__(head)
        setattr(head, _PATCHED, True)
    return True


def scoring_mode(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout off and the LM head in fp32; idempotent."""
    disable_dropout(model)
    fp32_head(model)
    return model
