"""Qwen2, Qwen3 and Llama models built locally (BPE tokenizers trained here) load in transformers
and are served by a real vLLM CPU server whose log-probs match a transformers forward pass.

Each served case starts one vLLM server (~30 s, ~3 GB) and stops it before the next."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
from rlgw.ports import free_port
from trainer.backends.parity import reference_scores, served_scores
from trainer.models.init_model import create_model
from trainer.models.weights import load_reference_model

# family -> create_model options. Llama is also written as vLLM finds hub checkpoints: bf16 on
# disk, in shards with an index.
CASES = {
    "qwen2": {"family": "qwen2", "tokenizer": "bpe"},
    "qwen3": {"family": "qwen3"},
    "llama": {"family": "llama", "dtype": "bfloat16", "max_shard_size": "150KB"},
}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module", params=sorted(CASES))
def model_dir(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / request.param
    return create_model(out, "tiny", seed=0, **CASES[request.param])


def test_the_model_and_tokenizer_load_in_transformers(model_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = "def f(x):\n    return x + 1  # héllo 🌍"
    ids = tokenizer.encode(text, add_special_tokens=False)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert ids == raw.encode(text, add_special_tokens=False).ids  # one tokenization everywhere
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode()) * 0.8  # merges were learned: not one id per byte
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer)) and torch.isfinite(logits).all()
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert config.get("head_dim", head_dim) == head_dim == 32  # accepted by vLLM's CPU kernel


def test_the_chat_template_renders_in_the_familys_style(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    if model_dir.name == "llama":
        assert rendered == (
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
        assert tokenizer.eos_token == "<|eot_id|>"
    else:
        assert rendered == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        assert tokenizer.eos_token == "<|im_end|>"
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id


def test_the_reference_loader_reads_the_checkpoint_as_written(model_dir: Path) -> None:
    """fp32 from bf16 shards too: the upcast is exact, so the weights are the bf16 values."""
    from safetensors.torch import load_file

    model = load_reference_model(model_dir)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    on_disk = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        on_disk.update(load_file(str(shard)))
    if model_dir.name == "llama":
        assert len(list(model_dir.glob("model-*-of-*.safetensors"))) > 1
        assert (model_dir / "model.safetensors.index.json").exists()
        assert {t.dtype for t in on_disk.values()} == {torch.bfloat16}
    params = dict(model.named_parameters())
    for name, tensor in on_disk.items():
        assert torch.equal(params[name].detach(), tensor.float()), name


@pytest.fixture(scope="module")
def served(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vLLM CPU server of this case's model (fp32), stopped when the case is done."""
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / f"vllm-{model_dir.name}.log"
    proc = start_backend(model_dir, port, served_model_name=model_dir.name, log_path=log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout_s=420, proc=proc)
        yield url
    finally:
        stop_backend(proc)


def test_served_log_probs_match_transformers_in_fp32(model_dir: Path, served: str) -> None:
    reference = reference_scores(load_reference_model(model_dir))
    with httpx.Client(timeout=300) as http:
        scores = served_scores(http, served, model_dir.name)
    assert scores.max_abs_diff(reference) < 1e-4
    assert scores.next_token == reference.next_token


def test_vllm_renders_the_same_chat_prompt_tokens(model_dir: Path, served: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    if not isinstance(expected, list):  # some versions return a BatchEncoding
        expected = expected["input_ids"]
    reply = httpx.post(
        f"{served}/v1/chat/completions",
        timeout=300,
        json={
            "model": model_dir.name,
            "messages": MESSAGES,
            "max_tokens": 4,
            "return_token_ids": True,
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt_token_ids"] == expected


def test_qwen3_has_query_and_key_norms(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = create_model(tmp_path / "q3", "tiny", seed=1, family="qwen3")
    names = load_file(str(out / "model.safetensors")).keys()
    assert "model.layers.0.self_attn.q_norm.weight" in names
    assert "model.layers.0.self_attn.k_norm.weight" in names


def test_qwen3_drops_the_reasoning_of_earlier_answers_only(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(create_model(tmp_path / "q3", "tiny", family="qwen3"))
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "<think>so</think>\nyes"},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>hm</think>because"},
    ]
    rendered = tokenizer.apply_chat_template(history, tokenize=False)
    assert "<|im_start|>assistant\nyes<|im_end|>" in rendered  # before the last user turn
    assert "<think>so</think>" not in rendered
    assert "<|im_start|>assistant\n<think>hm</think>because<|im_end|>" in rendered


def test_the_default_is_the_byte_level_qwen2_model(tmp_path: Path) -> None:
    default = create_model(tmp_path / "default", "tiny", seed=2)
    explicit = create_model(tmp_path / "explicit", "tiny", seed=2, family="qwen2", tokenizer="byte")
    for path in default.iterdir():
        assert path.read_bytes() == (explicit / path.name).read_bytes(), path.name
    assert json.loads((default / "config.json").read_text())["vocab_size"] == 259


def test_a_bpe_family_is_deterministic(tmp_path: Path) -> None:
    a = create_model(tmp_path / "a", "tiny", seed=3, family="llama", max_shard_size="150KB")
    b = create_model(tmp_path / "b", "tiny", seed=3, family="llama", max_shard_size="150KB")
    for path in a.iterdir():
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


@pytest.mark.parametrize(
    "options, says",
    [
        ({"family": "llama", "tokenizer": "byte"}, "needs tokenizer='bpe'"),
        ({"family": "mistral"}, "choose one of"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"tokenizer": "sentencepiece"}, "tokenizer must be one of"),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        create_model(tmp_path / "m", "tiny", **options)


@contextlib.contextmanager
def gateway_on(model_dir: Path, served: str, make_database, home: Path) -> Iterator[tuple]:
    """A gateway on a new database routing this case's model to its server: (its URL, the
    database engine, the gateway's settings)."""
    from gateway.main import create_app
    from migrations.runner import upgrade
    from rlgw.db.engine import make_sync_engine, sync_session_factory
    from rlgw.registry import register_backend

    from conftest import LiveServer, gateway_settings

    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    register_backend(
        sync_session_factory(engine), model_dir.name, served, model_path=str(model_dir)
    )
    settings = gateway_settings(db_url).model_copy(update={"home": home})
    try:
        with LiveServer(create_app(settings), free_port()) as gateway:
            yield gateway.url, engine, settings
    finally:
        engine.dispose()


def test_a_template_that_drops_earlier_reasoning_cuts_the_sessions_sequence_there(
    model_dir: Path, served: str, make_database, tmp_path: Path
) -> None:
    """Qwen3's template keeps only the answer after `</think>` of an earlier turn: the next
    turn's recorded prompt departs from the recorded output inside it, so the training view
    starts a new sequence there, cut `output_retokenized`; the turn before stays whole."""
    import openai

    if model_dir.name != "qwen3":
        pytest.skip("only Qwen3's template drops earlier reasoning")
    with gateway_on(model_dir, served, make_database, tmp_path) as (url, _, _):
        http = httpx.Client(base_url=url, timeout=300)
        session = http.post("/v1/sessions", json={}).json()
        client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
        messages = [*MESSAGES]
        first = client.chat.completions.create(
            model=model_dir.name,
            messages=messages,
            max_tokens=48,
            extra_body={"structured_outputs": {"regex": "<think>[a-z]{2,4}</think>[a-z]{2,4}"}},
        )
        answer = first.choices[0].message.content
        assert answer.startswith("<think>") and "</think>" in answer, answer
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Go on"}]
        second = client.chat.completions.create(
            model=model_dir.name, messages=messages, max_tokens=4
        )
        assert http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 1.0}).is_success
        view = http.get(
            f"/v1/sessions/{session['id']}/trajectory", params={"view": "training"}
        ).json()
    sequences = view["sequences"]
    assert [[t["completion_id"] for t in s["turns"]] for s in sequences] == [
        [first.id],
        [second.id],
    ]
    (cut,) = sequences[1]["cuts"]
    assert (cut["at"], cut["reason"]) == (second.id, "output_retokenized")
    assert f"inside {first.id}'s output" in cut["detail"]
    # the structured (grammar-constrained) turn is context; the free one carries the loss
    assert sum(sequences[0]["loss_mask"]) == 0 and sum(sequences[1]["loss_mask"]) > 0


def test_record_reward_train_and_a_verified_swap(
    model_dir: Path, served: str, make_database, tmp_path: Path
) -> None:
    """The whole loop on this family: completions recorded through the gateway, rewarded, one
    update, the verified swap, and the next completion stamped with the new version. (Last in
    the module: the swap changes what this case's server serves.)"""
    import openai

    from trainer.config import TrainerConfig
    from trainer.loop.service import OnlineTrainer

    from conftest import ADMIN_KEY

    with gateway_on(model_dir, served, make_database, tmp_path) as (url, engine, settings):
        http = httpx.Client(base_url=url, timeout=300)
        for reward in (1.0, 0.0, 0.5):
            session = http.post("/v1/sessions", json={}).json()
            client = openai.OpenAI(base_url=session["base_url"], api_key="unused")
            client.chat.completions.create(model=model_dir.name, messages=MESSAGES, max_tokens=6)
            http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": reward})
            http.post(f"/v1/sessions/{session['id']}/close")
        trainer = OnlineTrainer(
            settings, engine, model_dir.name, TrainerConfig(lr=1e-2, batch_sessions=8)
        )
        report = trainer.step()
        trainer.close()
        assert report is not None and report.version == 1 and report.samples == 3
        assert [s.outcome for s in report.swaps] == ["swapped"]
        with httpx.Client(timeout=300) as probe:
            after = served_scores(probe, served, model_dir.name)
        assert after.max_abs_diff(reference_scores(trainer.model)) < 1e-4
        reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions
        completion = reply.create(model=model_dir.name, messages=MESSAGES, max_tokens=4)
        admin = httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY})
        assert admin.get(f"/admin/completions/{completion.id}").json()["policy_version"] == 1
