"""The gate's evaluation format: prompts and scorers, the built-in copy4 task, and refusals that
name the line."""

from __future__ import annotations

import json

import pytest

from trainer.gate import evaluation
from trainer.models import demo_task


def line(**fields) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "Copy: abcd"}], **fields})


def test_a_file_parses_with_defaults(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(line(target="abcd") + "\n" + line(target="x", scorer="contains") + "\n\n")
    name, items = evaluation.load(str(path))
    assert name == str(path.resolve())
    assert [(i["scorer"], i["max_tokens"]) for i in items] == [("exact", 16), ("contains", 16)]


@pytest.mark.parametrize(
    ("answer", "scorer", "expected"),
    [
        (" abcd\n", "exact", 1.0),
        ("abcde", "exact", 0.0),
        ("it is abcd.", "contains", 1.0),
        ("abxd", "copy4", 0.75),
        ("abcd<|im_end|>", "copy4", 1.0),
    ],
)
def test_scorers(answer, scorer, expected):
    assert evaluation.score({"target": "abcd", "scorer": scorer}, answer) == expected


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "line 2"),
        (line(target="a", scorer="bleu"), "line 2"),
        (line(target="a", extra=1), "line 2"),
        (json.dumps({"messages": [], "target": "a"}), "line 2"),
        ("", "line 2"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(tmp_path, bad, says):
    path = tmp_path / "eval.jsonl"
    path.write_text(line(target="abcd") + "\n" + bad + "\n" + line(target="abcd") + "\n")
    with pytest.raises(evaluation.EvalFormatError, match=says):
        evaluation.load(str(path))


def test_a_missing_file_or_unknown_task_is_refused(tmp_path):
    with pytest.raises(evaluation.EvalFormatError, match="cannot read"):
        evaluation.load(str(tmp_path / "absent.jsonl"))


def test_the_copy4_task_is_the_held_out_split_with_its_reward():
    name, items = evaluation.load("copy4", 5)
    assert name == "copy4" and len(items) == 5
    for item in items:
        text = item["target"]
        assert demo_task.split_of(text) == demo_task.HELD_OUT_SPLIT
        assert item["messages"] == [{"role": "user", "content": "Copy: " + text}]
        assert item["scorer"] == "copy4" and item["max_tokens"] == demo_task.MAX_NEW_TOKENS
    assert evaluation.digest(items) == evaluation.digest(evaluation.load("copy4", 5)[1])
    assert evaluation.digest(items) != evaluation.digest(evaluation.load("copy4", 6)[1])
