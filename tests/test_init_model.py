"""Fast tests of the local model factory: determinism, tokenizer, chat template, loading."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainer.models.byte_model import IM_END_ID, PRESETS, VOCAB_SIZE  # noqa: E402
from trainer.models.init_model import create_model, model_fingerprint  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_model(tmp_path_factory.mktemp("tiny") / "model", "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def _safetensors_bytes(model_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(model_dir.glob("*.safetensors")))


def test_same_seed_gives_identical_bytes(tiny: Path, tmp_path: Path) -> None:
    again = create_model(tmp_path / "again", "tiny", seed=0)
    assert _safetensors_bytes(again) == _safetensors_bytes(tiny)
    assert model_fingerprint(again) == model_fingerprint(tiny)


def test_different_seed_differs(tiny: Path, tmp_path: Path) -> None:
    other = create_model(tmp_path / "other", "tiny", seed=1)
    assert model_fingerprint(other) != model_fingerprint(tiny)


def test_refuses_to_overwrite_unless_asked(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    create_model(out, "tiny", seed=3)
    with pytest.raises(FileExistsError):
        create_model(out, "tiny", seed=4)
    create_model(out, "tiny", seed=0, overwrite=True)
    assert model_fingerprint(out) == model_fingerprint(tiny)


def test_presets_have_supported_head_dims() -> None:
    for shape in PRESETS.values():
        assert shape.hidden_size % shape.num_heads == 0
        assert shape.head_dim in {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}
    assert PRESETS["tiny"].head_dim == 32


@pytest.mark.parametrize(
    "text",
    ["héllo 🌍\n\ttabs", "", " leading and  double  spaces ", "日本語\r\n\x00\x7f", "a<b>&'\"\\"],
)
def test_tokenizer_round_trips_utf8(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_nfd_text_is_composed_like_every_loader_does(tiny: Path, tokenizer) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    nfd = "cafe\u0301 \u212b"  # transformers >= 5 forces NFC for qwen2 models
    nfc = unicodedata.normalize("NFC", nfd)
    assert tokenizer.encode(nfd, add_special_tokens=False) == list(nfc.encode())
    assert raw.encode(nfd).ids == list(nfc.encode())
    text = "héllo 🌍\n\ttabs <|im_end|> x"
    assert raw.encode(text).ids == tokenizer.encode(text, add_special_tokens=False)


def test_ascii_token_ids_are_bytes(tokenizer) -> None:
    text = "Hello, world!\n"
    assert tokenizer.encode(text, add_special_tokens=False) == list(text.encode())
    assert tokenizer.convert_ids_to_tokens(IM_END_ID) == "<|im_end|>"
    assert tokenizer.eos_token_id == IM_END_ID
    assert tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) == VOCAB_SIZE


def test_special_tokens_encode_to_single_ids(tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids == [257, *b"user\nhi", 258]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_renders_chatml(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False)
    assert without == rendered.removesuffix("<|im_start|>assistant\n")


def test_chat_template_renders_tools(tokenizer) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("<|im_start|>system\nSys.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n</tools>" in rendered
    assert rendered.count("<|im_start|>system") == 1
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
    ) in rendered
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in rendered
    assert rendered.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_files_written(tiny: Path) -> None:
    names = {p.name for p in tiny.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= names
    assert "tokenizer_config.json" in names
    config = json.loads((tiny / "config.json").read_text())
    assert config["vocab_size"] == VOCAB_SIZE
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert json.loads((tiny / "generation_config.json").read_text())["eos_token_id"] == IM_END_ID


def test_transformers_loads_and_runs(tiny: Path, tokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, return_tensors="pt"
    )
    if not isinstance(ids, torch.Tensor):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], VOCAB_SIZE)
    assert torch.isfinite(logits).all()
