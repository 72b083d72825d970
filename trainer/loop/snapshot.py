"""What an update of several optimizer steps must be able to put back: the trainable weights and
the optimizer's state (AdamW's moments and step count) as they were before its first step.

Taken only when an update plans more than one step (minibatches x epochs > 1): with one step the
non-finite check runs before it, and nothing has moved when it fails. The copies stay on the
training device (a DTensor shard copies as a shard), one copy of the trainable weights and of the
moments; LoRA copies only the adapter.
"""

from __future__ import annotations

import torch


class TrainingSnapshot:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            self.weights = [p.detach().clone() for p in self.params]
        self.state = {
            p: {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
            for p, state in optimizer.state.items()
        }
        self.lrs = [group["lr"] for group in optimizer.param_groups]

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Put the weights and the optimizer's state back exactly (an AdamW that had taken no
        step gets its empty state back)."""
        with torch.no_grad():
            for param, saved in zip(self.params, self.weights, strict=True):
                param.copy_(saved)
        optimizer.state.clear()
        for param, state in self.state.items():
            optimizer.state[param] = {
                k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()
            }
        for group, lr in zip(optimizer.param_groups, self.lrs, strict=True):
            group["lr"] = lr
