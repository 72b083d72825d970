"""The models bench/gpu_check.py trains and the configurations it runs on each: Qwen2.5-shaped 0.5B
and 1.5B, and the project's default model's own architecture (SmolLM2-135M-Instruct), all built
from their shapes with random weights (no weights travel to the GPU box)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer.models.byte_model import ModelShape
from trainer.models.model_families import FAMILIES, build_config, build_model

QWEN25_VOCAB = 151_936
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# SmolLM2-135M-Instruct, the default model (trainer/models/pretrained.py): LlamaForCausalLM with
# the values of its converted checkpoint's config.json (transformers 5.19, 2026-12-06), 134.5M
# parameters, tied embeddings.
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49_152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 9.999999747378752e-06,
    "rope_theta": 100_000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
# The same architecture scaled down, for --quick on a CPU (head_dim kept at 64).
TINY_LLAMA = SMOLLM2_135M | {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


@dataclass(frozen=True)
class Size:
    """One model and the batch it trains on: `samples` of prompt + output tokens."""

    name: str
    shape: ModelShape | None  # a Qwen2 shape (trainer/models/model_families.py), or
    vocab: int
    samples: int
    prompt: int
    output: int
    microbatch: int  # max_tokens_per_microbatch
    steps: int  # measured steps after the warm-up step
    llama: dict[str, Any] | None = None  # a LlamaConfig's values, built as they are


@dataclass(frozen=True)
class Run:
    size: Size
    mode: str  # full | lora
    dtype: str
    lora_rank: int = 0
    fsdp: bool = False
    checkpointing: bool = False

    @property
    def name(self) -> str:
        parts = [self.size.name, f"lora{self.lora_rank}" if self.mode == "lora" else "full"]
        parts += (
            [self.dtype]
            + (["fsdp2"] if self.fsdp else [])
            + (["ckpt"] if self.checkpointing else [])
        )
        return "/".join(parts)


QWEN25_05B = ModelShape(896, 24, 14, 2, 4864, 32768)  # Qwen2.5-0.5B: head_dim 64
QWEN25_15B = ModelShape(1536, 28, 12, 2, 8960, 32768)  # Qwen2.5-1.5B: head_dim 128
SMOLLM2_VOCAB = SMOLLM2_135M["vocab_size"]
SIZES = {  # 16 samples of 256 prompt + 768 output tokens: 16,384 tokens, 4 micro-batches a step
    "smollm2": Size("smollm2-135m", None, SMOLLM2_VOCAB, 16, 256, 768, 4096, 3, SMOLLM2_135M),
    "0.5b": Size("qwen2-0.5b", QWEN25_05B, QWEN25_VOCAB, 16, 256, 768, 4096, 3),
    "1.5b": Size("qwen2-1.5b", QWEN25_15B, QWEN25_VOCAB, 16, 256, 768, 4096, 3),
    "quick": Size("tiny", ModelShape(64, 2, 1, 1, 128, 512), 512, 6, 12, 20, 96, 1),
    "quick-llama": Size("tiny-llama", None, 512, 6, 12, 20, 96, 1, TINY_LLAMA),
}


def runs_for(size: Size) -> list[Run]:
    """The configurations, cheapest first within a size, so a budget cut drops the dear ones.
    The default model's architecture: bf16, full weights and LoRA rank 8 (the rank `rlgw up`'s
    LoRA backends are started for)."""
    if size.llama is not None:
        return [Run(size, "full", "bfloat16"), Run(size, "lora", "bfloat16", lora_rank=8)]
    return [
        Run(size, "full", "bfloat16"),
        Run(size, "lora", "bfloat16", lora_rank=8),
        Run(size, "lora", "bfloat16", lora_rank=64),
        Run(size, "full", "bfloat16", fsdp=True),
        Run(size, "full", "bfloat16", checkpointing=True),
        Run(size, "lora", "float32", lora_rank=64),
        Run(size, "full", "float32"),
    ]


def build(run: Run, device: torch.device, seed: int) -> torch.nn.Module:
    """The run's model in fp32 on `device`, weights drawn from `seed`."""
    if run.size.llama is not None:
        import transformers

        torch.manual_seed(seed)
        config = transformers.LlamaConfig(**run.size.llama)
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config).to(torch.float32)
        return model.eval()
    fam = FAMILIES["qwen2"]
    ids = {"bos": None, "eos": run.size.vocab - 2, "pad": run.size.vocab - 1}
    config = build_config(fam, run.size.shape, run.size.vocab, ids)
    return build_model(fam, config, seed, device=str(device), redraw=device.type == "cpu")


def lora_wrap(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS)
    return get_peft_model(model, config)
