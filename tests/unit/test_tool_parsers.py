"""The tool-call parser follows what a checkpoint's tokenizer and chat template support."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgw.tool_parsers import AUTO, ToolParserError, choose_tool_parser

TOOLS_TEMPLATE = "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
HERMES_TEMPLATE = TOOLS_TEMPLATE + "reply with <tool_call>{json}</tool_call>"
PLAIN_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"


def checkpoint(root: Path, *, model_type: str, template: str, added: tuple[str, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": model_type}))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tokens = [{"id": 100 + i, "content": t, "special": True} for i, t in enumerate(added)]
    vocab = {"a": 0, "b": 1}
    (root / "tokenizer.json").write_text(
        json.dumps({"added_tokens": tokens, "model": {"type": "BPE", "vocab": vocab}})
    )
    return root


def test_a_llama_checkpoint_without_the_python_tag_starts_without_tool_calling(tmp_path):
    """SmolLM2: a Llama architecture whose tokenizer lacks <|python_tag|> and whose template
    renders no tools. The family's parser would make vLLM fail at start."""
    model = checkpoint(tmp_path / "smol", model_type="llama", template=PLAIN_TEMPLATE)
    choice = choose_tool_parser(model, AUTO)
    assert choice.parser is None
    assert "serves without tool calling" in choice.notice and "\n" not in choice.notice


def test_a_meta_llama_checkpoint_gets_llama3_json(tmp_path):
    model = checkpoint(
        tmp_path / "llama3", model_type="llama", template=TOOLS_TEMPLATE, added=("<|python_tag|>",)
    )
    assert choose_tool_parser(model, AUTO).parser == "llama3_json"


def test_a_template_that_writes_tool_call_tags_gets_hermes_whatever_the_family(tmp_path):
    model = checkpoint(tmp_path / "tuned", model_type="llama", template=HERMES_TEMPLATE)
    assert choose_tool_parser(model, AUTO).parser == "hermes"
    qwen = checkpoint(tmp_path / "qwen", model_type="qwen2", template=HERMES_TEMPLATE)
    assert choose_tool_parser(qwen, AUTO).parser == "hermes"


def test_a_named_parser_the_checkpoint_cannot_support_is_refused_in_one_line(tmp_path):
    model = checkpoint(tmp_path / "smol", model_type="llama", template=TOOLS_TEMPLATE)
    with pytest.raises(ToolParserError, match="no <\\|python_tag\\|> token") as refused:
        choose_tool_parser(model, "llama3_json")
    assert "\n" not in str(refused.value)


def test_a_named_parser_that_fits_or_that_is_unknown_here_is_passed_on(tmp_path):
    model = checkpoint(tmp_path / "m", model_type="qwen2", template=HERMES_TEMPLATE)
    assert choose_tool_parser(model, "hermes").parser == "hermes"
    assert choose_tool_parser(model, "pythonic").parser == "pythonic"  # vLLM judges those
    assert choose_tool_parser(model, None).parser is None


def test_the_project_presets_keep_hermes(tmp_path):
    from trainer.models.init_model import create_model

    model = create_model(tmp_path / "tiny", preset="tiny", seed=0)
    assert choose_tool_parser(model or tmp_path / "tiny", AUTO).parser == "hermes"
