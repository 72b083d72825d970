"""Model families vLLM and transformers share: Qwen2, Qwen3 (q/k norms) and Llama, built locally.

Each family names its transformers config and model classes, its special tokens and a chat
template in its own style (ChatML for Qwen; Qwen3's drops the reasoning of earlier answers from the
history, as the released Qwen3 template does; Llama 3's header tokens for Llama). The shapes come
from the byte model's presets; head_dim is hidden / heads (every preset's is one the vLLM CPU
attention kernel accepts). The byte-level Qwen2 model of `create_model`'s default
path is not built here: it stays exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from .byte_model import CHAT_TEMPLATE, INIT_STD, ModelShape, reinitialise

# Qwen3 style: ChatML, and an assistant answer before the last user message keeps only what follows
# its reasoning (`<think>...</think>`), as the released Qwen3 template renders the history. So a
# turn's prompt does not extend the previous turn's output when that output reasoned: the trainer
# cuts the session's sequence there (rlgw/sequences.py, `output_retokenized`).
_LAST_USER = (
    "{%- set ns = namespace(last_user=-1) -%}\n"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}\n"
)
_CHATML_OTHER = r"""    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}"""
_QWEN3_ASSISTANT = r"""    {%- elif message.role == 'assistant' -%}
        {%- set content = text(message.content) -%}
        {%- if loop.index0 < ns.last_user and '</think>' in content -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
"""
assert _CHATML_OTHER in CHAT_TEMPLATE
QWEN3_CHAT_TEMPLATE = _LAST_USER + CHAT_TEMPLATE.replace(
    _CHATML_OTHER, _QWEN3_ASSISTANT + _CHATML_OTHER
)

LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",  # Llama 3.1's tool-call marker: vLLM's llama3_json parser looks for it
)

# Llama 3 style: <|begin_of_text|>, then per message a role header and <|eot_id|>; tool results
# come in an `ipython` turn and tool calls as JSON, as Llama 3.1's own template writes them.
LLAMA3_CHAT_TEMPLATE = r"""{%- macro text(content) -%}
    {%- if content is string -%}{{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}{{- part -}}
            {%- elif part.type == 'text' -%}{{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set system = messages[0] if messages and messages[0].role == 'system' else none -%}
{%- if system is not none or tools -%}
    {{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
    {%- if system is not none -%}{{- text(system.content) | trim -}}{%- endif -%}
    {%- if tools -%}
        {{- ('\n\n' if system is not none else '') + 'You may call these functions, replying '
            + 'with {"name": <name>, "parameters": <json-object>}:' -}}
        {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {%- endif -%}
    {{- '<|eot_id|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if loop.first and message.role == 'system' -%}
        {#- rendered above -#}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- for call in message.tool_calls -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {{- '{"name": ' + (fn.name | tojson) + ', "parameters": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}
            {%- else -%}{{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}' -}}
        {%- endfor -%}
        {{- '<|eot_id|>' -}}
    {%- else -%}
        {%- set role = 'ipython' if message.role == 'tool' else message.role -%}
        {{- '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + (text(message.content) | trim)
            + '<|eot_id|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # the transformers class, also what vLLM dispatches on
    split: str  # the BPE pre-tokenizer: 'qwen' | 'llama3' (trainer/models/bpe_tokenizer.py)
    special_tokens: tuple[str, ...]
    bos: str | None
    eos: str  # ends an assistant turn
    pad: str
    chat_template: str
    tie_word_embeddings: bool  # as the family's small models do
    chatml: bool  # the byte-level ChatML tokenizer fits it too


FAMILIES: dict[str, Family] = {
    "qwen2": Family(
        "qwen2", "Qwen2ForCausalLM", "qwen",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
        CHAT_TEMPLATE, True, True,
    ),
    "qwen3": Family(
        "qwen3", "Qwen3ForCausalLM", "qwen",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
        QWEN3_CHAT_TEMPLATE, True, True,
    ),
    "llama": Family(
        "llama", "LlamaForCausalLM", "llama3",
        LLAMA3_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>",
        LLAMA3_CHAT_TEMPLATE, False, False,
    ),
}  # fmt: skip


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def build_bpe_tokenizer(fam: Family, model_max_length: int):
    """The family's BPE tokenizer (trained here), as a transformers fast tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from .bpe_tokenizer import train_bpe

    core = train_bpe(fam.split, list(fam.special_tokens))
    if fam.bos is not None:  # Llama 3 prefixes <|begin_of_text|> to every encoded text
        core.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A", special_tokens=[(fam.bos, core.token_to_id(fam.bos))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        chat_template=fam.chat_template,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def build_config(fam: Family, shape: ModelShape, vocab_size: int, ids: dict[str, int | None]):
    """The family's transformers config for `shape`; `ids` holds bos, eos and pad token ids."""
    import transformers

    if shape.hidden_size % shape.num_heads or shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"inconsistent head counts in {shape}")
    config_class = getattr(transformers, fam.architecture.replace("ForCausalLM", "Config"))
    extra = {"use_sliding_window": False} if fam.name.startswith("qwen") else {}
    return config_class(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=INIT_STD,
        tie_word_embeddings=fam.tie_word_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        **extra,
    )


def build_model(fam: Family, config, seed: int, *, device: str = "cpu", redraw: bool = True):
    """The family's causal LM in fp32, built on `device`. With `redraw` every weight is drawn
    from `seed` in a fixed order as init_model does (normal 0.02, norms 1, biases 0: the same
    bytes on any machine); without it transformers' own seeded init on the device is kept (a
    GPU builds a 1.5B model in seconds that way, where a CPU generator takes minutes)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model_class = getattr(transformers, fam.architecture)
    with torch.device(device):
        model = model_class(config).to(torch.float32)
    if redraw:
        reinitialise(model, seed)
    return model.eval()


def token_ids(fam: Family, tokenizer) -> dict[str, int | None]:
    return {
        "bos": tokenizer.convert_tokens_to_ids(fam.bos) if fam.bos else None,
        "eos": tokenizer.convert_tokens_to_ids(fam.eos),
        "pad": tokenizer.convert_tokens_to_ids(fam.pad),
    }
