"""Which vLLM tool-call parser a checkpoint can use, read from its tokenizer and chat template.

A parser is chosen from what the checkpoint supports, not from its architecture alone: a
Llama-architecture model that is not Meta's (SmolLM2, TinyLlama, community fine-tunes) has no
`<|python_tag|>` token, and vLLM's `llama3_json` parser refuses to start without it. Each parser
this module knows has a requirement that can be checked on disk before vLLM starts; a parser it
does not know is passed to vLLM as named (vLLM is the judge then).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlgw.model_dir import ModelDirError

# The parser tried first for each `model_type` whose chat template usually emits that format;
# `choose_tool_parser` keeps it only if the checkpoint meets its needs (PARSER_NEEDS).
TOOL_PARSERS: dict[str, str] = {
    "qwen2": "hermes",  # Qwen2 / Qwen2.5 (and this project's byte-level presets)
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "llama": "llama3_json",  # Llama 3.x
    "mistral": "mistral",
}

AUTO = "auto"


@dataclass(frozen=True)
class ParserNeeds:
    """What a parser needs from the checkpoint: a token in the vocabulary (vLLM looks it up at
    start), or a mark in the chat template (the format the template teaches the model)."""

    token: str | None = None
    template_mark: str | None = None

    def unmet(self, tokenizer: TokenizerFacts) -> str | None:
        if not tokenizer.renders_tools:
            return "its chat template does not render tools"
        if self.token and self.token not in tokenizer.tokens:
            return f"its tokenizer has no {self.token} token"
        if self.template_mark and self.template_mark not in tokenizer.template:
            return f"its chat template never writes {self.template_mark}"
        return None


# Read from vLLM 0.32's parsers: hermes parses <tool_call> text (no token needed), llama3_json
# looks up <|python_tag|> at start, mistral's format starts with [TOOL_CALLS].
PARSER_NEEDS: dict[str, ParserNeeds] = {
    "hermes": ParserNeeds(template_mark="<tool_call>"),
    "llama3_json": ParserNeeds(token="<|python_tag|>"),
    "mistral": ParserNeeds(token="[TOOL_CALLS]"),
}


class ToolParserError(ModelDirError):
    """A parser the user named cannot work with this checkpoint (one line, before vLLM starts)."""


@dataclass(frozen=True)
class TokenizerFacts:
    template: str  # the chat template's text ('' when there is none)
    tokens: frozenset[str]  # special and added tokens, and the vocabulary's entries

    @property
    def renders_tools(self) -> bool:
        return "tools" in self.template


@dataclass(frozen=True)
class ToolParserChoice:
    parser: str | None  # None: serve without tool calling
    notice: str | None  # one line for the console when tool calling is off


def _chat_template(root: Path, config: dict) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    if isinstance(template, str) and template:
        return template
    for name in ("chat_template.jinja", "chat_template.json"):
        path = root / name
        if path.is_file():
            text = path.read_text(errors="replace")
            if name.endswith(".json"):
                try:
                    return str(json.loads(text).get("chat_template", ""))
                except (ValueError, AttributeError):
                    return ""
            return text
    return ""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_tokenizer(model_dir: Path | str) -> TokenizerFacts:
    """The chat template and the token strings of a Hugging Face checkpoint directory."""
    root = Path(model_dir)
    config = _read_json(root / "tokenizer_config.json")
    tokens: set[str] = {
        str(t.get("content"))
        for t in (config.get("added_tokens_decoder") or {}).values()
        if isinstance(t, dict)
    }
    fast = _read_json(root / "tokenizer.json")
    tokens.update(str(t.get("content")) for t in fast.get("added_tokens") or [])
    vocab = (fast.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        tokens.update(vocab)
    return TokenizerFacts(_chat_template(root, config), frozenset(tokens))


def _family_parser(root: Path) -> str | None:
    return TOOL_PARSERS.get(str(_read_json(root / "config.json").get("model_type")))


def choose_tool_parser(model_dir: Path | str, requested: str | None = AUTO) -> ToolParserChoice:
    """The parser to start vLLM with. `requested` None: tool calling off. AUTO: the family's
    parser when the checkpoint meets its needs, else any known parser it meets, else none (with
    a notice). A named parser that this checkpoint cannot meet is a ToolParserError."""
    root = Path(model_dir)
    if requested is None:
        return ToolParserChoice(None, None)
    facts = read_tokenizer(root)
    if requested != AUTO:
        needs = PARSER_NEEDS.get(requested)
        unmet = needs.unmet(facts) if needs else None
        if unmet:
            raise ToolParserError(
                f"--tool-call-parser {requested} cannot work with {root.name}: {unmet} "
                "(leave the flag out to choose automatically, or pass none)"
            )
        return ToolParserChoice(requested, None)
    family = _family_parser(root)
    if not facts.template and not facts.tokens:  # no tokenizer files to read: trust the family
        return ToolParserChoice(family, None)
    candidates = [family] if family else []
    candidates += [name for name in PARSER_NEEDS if name != family]
    for name in candidates:
        needs = PARSER_NEEDS.get(name)
        if needs is not None and needs.unmet(facts) is None:
            return ToolParserChoice(name, None)
    reason = PARSER_NEEDS[family].unmet(facts) if family in PARSER_NEEDS else None
    why = f"{family} would need what is missing: {reason}" if reason else "no known format"
    return ToolParserChoice(
        None, f"{root.name} serves without tool calling ({why}); --tool-call-parser to choose one"
    )
