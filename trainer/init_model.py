"""Create a small, randomly initialised model: by default Qwen2 with a byte-level tokenizer.

`create_model(..., family="qwen3" | "llama", tokenizer="bpe")` builds the other families with a
BPE tokenizer trained locally (trainer/model_families.py); `dtype="bfloat16"` and
`max_shard_size` write the checkpoint in bf16 and in shards, as hub checkpoints come.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
NUM_BYTES = 256
VOCAB_SIZE = NUM_BYTES + len(SPECIAL_TOKENS)  # 259
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = range(NUM_BYTES, VOCAB_SIZE)
INIT_STD = 0.02

# ChatML with Hermes-style tools: the tool schemas are listed tersely (every byte is a token here)
# in the system turn inside <tools></tools>; assistant tool calls are rendered as
# <tool_call>{json}</tool_call> (what vLLM's `hermes` tool parser extracts) and tool results as
# <tool_response>...</tool_response> in a `tool` turn.
CHAT_TEMPLATE = r"""{%- macro text(content) -%}
    {%- if content is string -%}{{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}{{- part -}}
            {%- elif part.type == 'text' -%}{{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages and messages[0].role == 'system' -%}
        {{- text(messages[0].content) + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\nTo call a tool, reply with '
        + '<tool_call>\n{"name": <name>, "arguments": <json-object>}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if tools and loop.first and message.role == 'system' -%}
        {#- already rendered above the tool list -#}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>tool\n<tool_response>\n' + text(message.content)
            + '\n</tool_response><|im_end|>\n' -}}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- '<|im_start|>assistant\n' + text(message.content) -}}
        {%- for call in message.tool_calls -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if message.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}
            {%- else -%}{{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


@dataclass(frozen=True)
class ModelShape:
    """Architecture sizes of a Qwen2-style decoder."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


PRESETS: dict[str, ModelShape] = {
    # head_dim 32: the vLLM CPU attention kernel rejects head_dim 16.
    "tiny": ModelShape(64, 2, 2, 1, 128, 2048),
    "small": ModelShape(256, 4, 4, 2, 768, 4096),
    # The shapes of a 0.5B Qwen2 (with the byte-level vocab: ~358M parameters).
    "bench-0.5b": ModelShape(896, 24, 14, 2, 4864, 32768),
}


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character map used by byte-level BPE tokenizers."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(NUM_BYTES):
        if b not in mapping:
            mapping[b] = chr(NUM_BYTES + shifted)
            shifted += 1
    return mapping


def build_tokenizer(model_max_length: int = 2048):
    """A byte-level tokenizer: id == UTF-8 byte for ids 0..255, then the ChatML special tokens.

    Text is NFC-normalised first because transformers >= 5 always loads a `qwen2` model's
    tokenizer as Qwen2Tokenizer, which adds NFC whatever tokenizer.json says; doing the same
    here keeps every loader (tokenizers, transformers 4/5, vLLM) on identical ids. So
    decode(encode(text)) == text exactly for NFC text (nearly all text); NFD input is composed.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert core.get_vocab_size() == VOCAB_SIZE
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer, out_dir: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """save_pretrained, then make tokenizer_config.json loadable by transformers 4.x as well:
    a PreTrainedTokenizerFast class name and the chat template inline (5.x writes it beside)."""
    tokenizer.save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = chat_template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build_config(shape: ModelShape):
    """A Qwen2 config for the preset shape and the byte-level vocabulary."""
    from transformers import Qwen2Config

    if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"inconsistent head counts in {shape}")
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=INIT_STD,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
        pad_token_id=ENDOFTEXT_ID,
        torch_dtype="float32",
    )


def build_model(shape: ModelShape, seed: int):
    """A Qwen2ForCausalLM with weights drawn deterministically from `seed` (normal, std 0.02)."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(build_config(shape)).to(torch.float32)
    _reinitialise(model, seed)
    return model.eval()


def _reinitialise(model, seed: int) -> None:
    """Redraw every parameter in a fixed order from one seeded generator (version-independent)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * INIT_STD)


def generation_config():
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID
    )


def _ensure_empty(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} is not empty (pass overwrite=True to replace it)")
        for old in out_dir.iterdir():
            if old.is_file() and (old.suffix in {".safetensors", ".json", ".jinja", ".txt"}):
                old.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


def _dir_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6


TOKENIZERS = ("byte", "bpe")
CHECKPOINT_DTYPES = ("float32", "bfloat16")


def create_model(
    out_dir: Path | str,
    preset: str = "tiny",
    seed: int = 0,
    *,
    overwrite: bool = False,
    family: str = "qwen2",
    tokenizer: str | None = None,
    dtype: str = "float32",
    max_shard_size: str | int | None = None,
) -> Path:
    """Write a random model (safetensors), its tokenizer and generation config to out_dir.

    family: qwen2 (default) | qwen3 | llama. tokenizer: "byte" (259 ids, ChatML: qwen2's default,
    also fits qwen3) or "bpe" (trained here; the default for the other families). dtype: the
    checkpoint's dtype on disk (weights are drawn in fp32 either way). max_shard_size (e.g.
    "200KB", "2GB"): split the weights into shards with a model.safetensors.index.json.
    The defaults write the same bytes as always.
    """
    from .model_families import family as get_family

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    fam = get_family(family)
    tokenizer = tokenizer or ("byte" if family == "qwen2" else "bpe")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, not {tokenizer!r}")
    if tokenizer == "byte" and not fam.chatml:
        raise ValueError(f"the byte tokenizer is ChatML; family {family!r} needs tokenizer='bpe'")
    if dtype not in CHECKPOINT_DTYPES:
        raise ValueError(f"dtype must be one of {CHECKPOINT_DTYPES}, not {dtype!r}")
    out_dir = Path(out_dir)
    _ensure_empty(out_dir, overwrite)
    shape = PRESETS[preset]

    print(f"[init-model] building {tokenizer} tokenizer", flush=True)
    tok, model = _build(fam, tokenizer, shape, seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[init-model] initialised {n_params:,} parameters "
        f"({family}, preset {preset}, seed {seed})",
        flush=True,
    )
    _save_weights(model, out_dir, dtype, max_shard_size)
    _generation_config(model.config).save_pretrained(out_dir)
    save_tokenizer(tok, out_dir, fam.chat_template)
    _write_provenance(out_dir, preset, seed, family=family, tokenizer=tokenizer, dtype=dtype)
    _make_readable(out_dir)
    print(f"[init-model] saved to {out_dir} ({_dir_size_mb(out_dir):.1f} MB)", flush=True)
    return out_dir


def _build(fam, tokenizer: str, shape: ModelShape, seed: int):
    """(tokenizer, model): the original byte-level Qwen2 exactly as before, or a family's."""
    from . import model_families

    if fam.name == "qwen2" and tokenizer == "byte":
        return build_tokenizer(shape.max_position_embeddings), build_model(shape, seed)
    if tokenizer == "byte":
        tok = build_tokenizer(shape.max_position_embeddings)
    else:
        tok = model_families.build_bpe_tokenizer(fam, shape.max_position_embeddings)
    config = model_families.build_config(fam, shape, len(tok), model_families.token_ids(fam, tok))
    return tok, model_families.build_model(fam, config, seed)


def _save_weights(model, out_dir: Path, dtype: str, max_shard_size: str | int | None) -> None:
    import torch

    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    extra = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    model.save_pretrained(out_dir, safe_serialization=True, **extra)


def _generation_config(config):
    """The default model's generation config as before; another family's from its own ids."""
    from transformers import GenerationConfig

    if config.model_type == "qwen2" and config.vocab_size == VOCAB_SIZE:
        return generation_config()
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def _make_readable(out_dir: Path) -> None:
    """transformers writes safetensors 0600; a server in a container may run as another user."""
    for path in out_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)


def _write_provenance(out_dir: Path, preset: str, seed: int, **build: str) -> None:
    info = {"preset": preset, "seed": seed, **build, "fingerprint": model_fingerprint(out_dir)}
    (out_dir / "rlgw_model.json").write_text(json.dumps(info, indent=2) + "\n")


def model_fingerprint(model_dir: Path | str) -> str:
    """sha256 over the model's safetensors files (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--family", default="qwen2", choices=["qwen2", "qwen3", "llama"])
    parser.add_argument("--tokenizer", default=None, choices=list(TOKENIZERS))
    parser.add_argument("--dtype", default="float32", choices=list(CHECKPOINT_DTYPES))
    parser.add_argument("--max-shard-size", default=None, help='e.g. "2GB"; default: one file')
    args = parser.parse_args(argv)
    create_model(
        args.out_dir,
        args.preset,
        args.seed,
        overwrite=args.overwrite,
        family=args.family,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
