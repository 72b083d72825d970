"""The project's byte-level Qwen2 model: its tokenizer (256 byte symbols and ChatML's special
tokens), its chat template (ChatML with Hermes-style tools), its shapes (presets) and a
deterministic random initialisation shared by every family (trainer/models/model_families.py)."""

from __future__ import annotations

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
    reinitialise(model, seed)
    return model.eval()


def reinitialise(model, seed: int) -> None:
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
