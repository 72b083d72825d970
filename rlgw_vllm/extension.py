"""vLLM worker extension: stage, apply, roll back and checksum weights inside a running server.

Loaded with `--worker-extension-cls rlgw_vllm.extension.WeightUpdateExtension`; its methods are
called over vLLM's `/collective_rpc` (string arguments only, JSON-able results). An update is done
in three calls so that only the middle one happens while the server is paused:

    rlgw_stage(path, kind)   start reading, validating and preparing the new weights in a
                             background thread; rlgw_stage_status() says when it is done
                             (rlgw_stage_url: the same file fetched over HTTP, verified first)
    rlgw_apply()             put the prepared weights in place; restore the old ones on failure
    rlgw_commit() / rlgw_rollback()   drop the old weights, or put them back exactly
    rlgw_generation_state()  while paused: each request's output tokens so far, and the requests
                             finished lately (rlgw_vllm/generation_state.py)
    rlgw_info()              the serving dtype (the trainer's verification band depends on it)
    rlgw_fetch_adapter(...)  a LoRA version's adapter folder on this host (read from the
                             trainer's path, or downloaded and verified) for /v1/load_lora_adapter

`kind` is "full" (new weights) or "delta" (theta_new - theta_served), both in Hugging Face naming.

Preparing uses the model's own `load_weights`, which knows how q/k/v and gate/up are fused, but
points every parameter at a scratch tensor while it runs, so the served weights are never written
during staging: a delta is loaded into zeroed scratch tensors (the update laid out like the vLLM
parameters), a full update into copies of the current parameters. Only the parameters that
`load_weights` reports (learnt once per set of names; later stages give the others a stand-in
that refuses writes, and learn again if one is written) and the modules that own them get any
further work.

The stage runs in a background thread of the worker, so the engine loop keeps serving requests
while it reads, validates, adds and packs (requests to a lone backend no longer wait for a whole
stage). A forward pass must never see a parameter pointed at scratch, so every forward step
(`execute_model`, `sample_tokens`) holds a lock, and the stage holds it only while parameters are
redirected: one chunk of `load_weights` (LOAD_CHUNK_BYTES) at a time (a layer's new packed copy
is built on a stand-in, `_PackingShadow`, and needs no lock).
Everything else the stage does touches private tensors or only reads served ones. The stage
thread shares the GIL with the engine loop: it reads the file with plain reads (which release
the GIL) and takes its tensors as views of a map of it (rlgw_vllm/safetensors_read.py), since
safetensors' load_file keeps the GIL while it copies each tensor out into fresh memory. And it
runs at a low CPU priority (rlgw_vllm/cpu_priority.py, nice 19 by default): where the backend has
no spare core, the stage takes what the forward passes leave rather than slowing them.
RLGW_STAGE_BACKGROUND=0 stages inside the call instead (the engine loop waits, as before).

Two ways to apply:

- "swap" (CPU build with eager execution, the default there): staging also computes
  new = served + delta into new tensors and builds the new packed (oneDNN / SGL) copies of the
  affected linear layers aside (a tied lm_head shares the embedding's tensor but has its own packed
  copy: it is repacked whenever the embedding changes). The apply, inside the pause, only rebinds
  each affected parameter's data and each affected layer's packed GEMM: no arithmetic, no
  repacking. The old tensors and packed copies are kept until commit; a failed apply or a rollback
  rebinds them (exact by construction).
- "inplace" (GPU builds, where CUDA graphs hold the parameters' addresses; or forced with
  RLGW_WEIGHT_APPLY=inplace): staging also copies the affected parameters aside (to host memory on
  an accelerator); the apply adds the prepared update (or copies the full values) in place, then
  repacks the affected layers on a CPU build. A failure or a rollback copies the saved values back
  and repacks.

In both, the new weights are bitwise those of zero / load_weights(delta) / add back (a float
addition is commutative), i.e. exactly what the trainer computes as theta + delta.

Memory: a swap holds the old and the new weights (and, on a CPU, both packed copies) from stage to
commit. Tensors that stop being served are kept for the next stage (a fresh allocation costs page
faults: 0.7 s for 1.4 GB on the project's machine; zeroing a used buffer 0.07 s), so between swaps
the worker holds one spare copy of the affected weights; RLGW_WEIGHT_POOL=0 frees it instead.

The extension is one class mixed into vLLM's worker, assembled from one module per job:
served.py (the state kept on the worker), serving_lock.py, buffers.py (the tensor pool),
packing.py (the CPU build's packed GEMMs), preparing.py (load_weights into scratch), staging.py
(the rpc calls that stage), applying.py (apply, commit, rollback), delivery.py (a version's file or
adapter on this host, fetch.py). The weight-file contract it checks is rlgw/weight_files.py, the
same module the trainer checks with.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from .applying import Applying
from .delivery import Delivery
from .generation_state import GenerationState


class WeightUpdateExtension(Delivery, Applying, GenerationState):
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner. The rpc
    methods (`rlgw_*`, called over /collective_rpc) are listed in this module's docstring."""

    def rlgw_info(self) -> dict[str, Any]:
        """What the trainer's verification needs to know of this server: its dtype."""
        dtype = self.model_runner.model_config.dtype  # type: ignore[attr-defined]
        return {"ok": True, "dtype": str(dtype).removeprefix("torch.")}

    @torch.no_grad()
    def rlgw_checksum(self) -> str:
        """sha256 over the served parameters (vLLM naming, name order, raw bytes)."""
        self._rlgw_wait_for_stage()  # a stage may point parameters at scratch
        digest = hashlib.sha256()
        for name, param in sorted(self._rlgw_params().items()):
            digest.update(name.encode())
            digest.update(param.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()
