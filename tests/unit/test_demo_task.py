"""The demo task: its reward, its prompts and splits, and the warm start's data and determinism."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from trainer.models import demo_task
from trainer.models.demo_task import (
    ALPHABET,
    HELD_OUT_SPLIT,
    LENGTH,
    TRAIN_SPLIT,
    Prompt,
    make_prompt,
    make_prompts,
    reward,
    split_of,
)


def prompt(text: str = "kxqm") -> Prompt:
    return make_prompt(text)


# ---------------------------------------------------------------- reward


def test_perfect_answer_scores_one() -> None:
    for p in make_prompts(0, 50) + make_prompts(0, 50, HELD_OUT_SPLIT):
        assert reward(p, p.target) == 1.0


def test_surrounding_whitespace_and_a_trailing_end_marker_are_ignored() -> None:
    assert reward(prompt(), " kxqm\n") == 1.0
    assert reward(prompt(), "kxqm<|im_end|>") == 1.0  # a server that keeps special tokens
    assert reward(prompt(), "kxqm<|im_end|>\n<|endoftext|>") == 1.0
    assert reward(prompt(), "kx<|im_end|>qm") < 1.0


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "\n",
        None,
        b"",
        "\ufffd",
        "\ufffd" * 8,
        "!!!!",
        "1234",
        "KXQM",
        "<|endoftext|>",
        "<|im_end|>",
        "\x00\x01",
        b"\xff\xfe\xfd",
        "zzzzzzzz",
        12345,
        ["kxqm"],
    ],
)
def test_garbage_and_empty_score_zero(garbage) -> None:
    assert reward(prompt("kxqm"), garbage) == 0.0


def test_partial_credit_is_positional_and_penalises_length() -> None:
    p = prompt("kxqm")
    assert reward(p, "kxqa") == 0.75
    assert reward(p, "kx") == 0.5
    assert reward(p, "kxqmkxqm") == 0.5  # right prefix, twice the length
    assert reward(p, "mqxk") == 0.0  # the right letters in the wrong places
    assert reward(p, "xqm") == 0.0  # shifted by one: no position matches
    assert reward(p, "k") == 0.25


def test_reward_accepts_bytes() -> None:
    assert reward(prompt("kxqm"), b"kxqm") == 1.0
    assert reward(prompt("kxqm"), b"kx\xffm") == 0.75  # invalid UTF-8 becomes U+FFFD


def test_reward_is_always_in_unit_interval_and_deterministic() -> None:
    rng = random.Random(1234)
    prompts = make_prompts(3, 20)
    for i in range(400):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
        p = prompts[i % len(prompts)]
        if i % 4 == 0:  # near misses too, so partial credit is exercised
            raw = p.target.encode()[: rng.randrange(LENGTH + 1)] + raw[:3]
        text = raw.decode("utf-8", errors="replace")
        for completion in (raw, text):
            value = reward(p, completion)
            assert 0.0 <= value <= 1.0
            assert value == reward(p, completion)
            assert isinstance(value, float)


def test_only_the_exact_answer_scores_one() -> None:
    p = prompt("abca")
    for cand in ("abc", "abcab", "Abca", "abca.", "a bca"):
        assert reward(p, cand) < 1.0


# ---------------------------------------------------------------- prompts and splits


def test_prompt_messages_are_one_user_turn() -> None:
    p = make_prompts(0, 1)[0]
    assert p.messages == [{"role": "user", "content": f"Copy: {p.text}"}]
    assert p.messages is not p.messages  # a fresh list every time: callers may mutate it
    assert p.target == p.text and len(p.text) == LENGTH and set(p.text) <= set(ALPHABET)
    assert p.prompt_id == f"copy4:{p.text}"


def test_prompts_are_deterministic_for_a_seed() -> None:
    assert make_prompts(7, 100) == make_prompts(7, 100)
    assert make_prompts("demo-0-1", 30, HELD_OUT_SPLIT) == make_prompts(
        "demo-0-1", 30, HELD_OUT_SPLIT
    )
    assert make_prompts(7, 40) == make_prompts(7, 100)[:40]  # a longer list extends a shorter
    assert make_prompts(7, 100) != make_prompts(8, 100)


def test_prompts_within_a_list_are_distinct() -> None:
    prompts = make_prompts(0, 2000)
    assert len({p.text for p in prompts}) == 2000


def test_each_list_stays_in_its_split() -> None:
    for seed in range(5):
        assert all(p.split == TRAIN_SPLIT == split_of(p.text) for p in make_prompts(seed, 300))
        held = make_prompts(seed, 300, HELD_OUT_SPLIT)
        assert all(p.split == HELD_OUT_SPLIT == split_of(p.text) for p in held)


def test_train_and_held_out_are_disjoint() -> None:
    train: set[str] = set()
    for seed in itertools.chain(range(20), ("demo-0-0", "warm_start/0/0/1", "rl/0/1")):
        train |= {p.text for p in make_prompts(seed, 500)}
    held: set[str] = set()
    for seed in itertools.chain(range(20), ("held-out-eval",)):
        held |= {p.text for p in make_prompts(seed, 500, HELD_OUT_SPLIT)}
    assert train and held and not train & held


def test_split_partitions_the_input_space() -> None:
    """Every string is in exactly one split, decided by the string alone (~1 in 8 held out)."""
    rng = random.Random(0)
    texts = {"".join(rng.choice(ALPHABET) for _ in range(LENGTH)) for _ in range(8000)}
    held = sum(split_of(t) == HELD_OUT_SPLIT for t in texts)
    assert 0.10 < held / len(texts) < 0.15
    for t in list(texts)[:200]:
        assert make_prompt(t).split == split_of(t)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        make_prompts(0, 3, "test")
    with pytest.raises(ValueError):
        make_prompts(0, -1)
    with pytest.raises(ValueError):
        make_prompt("ABCD")
    assert make_prompts(0, 0) == []


def test_mean_reward() -> None:
    ps = make_prompts(0, 4)
    assert demo_task.mean_reward(ps, [p.target for p in ps]) == 1.0
    assert demo_task.mean_reward(ps, ["", "", "", ""]) == 0.0
    assert demo_task.mean_reward([], []) == 0.0


# ---------------------------------------------------------------- warm start (small and fast)


def test_warm_start_labels_only_the_answer_and_its_end_token() -> None:
    pytest.importorskip("transformers")
    from trainer.models.byte_model import IM_END_ID, build_tokenizer
    from trainer.models.warm_start import IGNORE_INDEX, encode_examples, encode_prompts

    tok = build_tokenizer()
    prompts = make_prompts(0, 3)
    input_ids, labels, mask = encode_examples(tok, prompts)
    prompt_ids = encode_prompts(tok, prompts)
    for i, p in enumerate(prompts):
        n = int(mask[i].sum())
        row, lab = input_ids[i, :n].tolist(), labels[i, :n].tolist()
        assert row[: len(prompt_ids[i])] == prompt_ids[i]
        trained = [t for t in lab if t != IGNORE_INDEX]
        assert trained == [*p.target.encode(), IM_END_ID]
        assert row[-len(trained) :] == trained  # the answer closes the row
        assert tok.decode(prompt_ids[i]).endswith("<|im_start|>assistant\n")


def test_warm_start_is_deterministic_and_keeps_the_tokenizer(tmp_path) -> None:
    pytest.importorskip("torch")
    from trainer.models.init_model import create_model, model_fingerprint
    from trainer.models.warm_start import warm_start

    tiny = dict(steps=3, batch_size=8, stop_nll=None, log_every=0, log=lambda _: None)
    dirs = [create_model(tmp_path / f"m{i}", "tiny", seed=5) for i in range(2)]
    before = {p.name: p.read_bytes() for p in dirs[0].iterdir() if p.name.startswith("tok")}
    fresh = model_fingerprint(dirs[0])
    runs = [warm_start(d, seed=5, **tiny) for d in dirs]
    assert runs[0]["final_loss"] == runs[1]["final_loss"]
    assert runs[0]["total_steps"] == 3 and runs[0]["attempts"] == 1
    assert model_fingerprint(dirs[0]) == model_fingerprint(dirs[1]) != fresh
    info = json.loads((dirs[0] / "rlgw_model.json").read_text())
    assert info["fingerprint"] == model_fingerprint(dirs[0])
    assert info["warm_start"]["recipe"]["steps"] == 3
    assert {p.name: p.read_bytes() for p in dirs[0].iterdir() if p.name.startswith("tok")} == before
    assert not (dirs[0] / ".warm_start.tmp").exists()
