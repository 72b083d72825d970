"""lm-evaluation-harness scores a tiny local loglikelihood task through the gateway exactly as
against vLLM directly (its `local-completions` model: `echo`, `logprobs` 1, `max_tokens` 1), and
every request it sent is recorded with the prompt's and the output's tokens apart.

Skipped unless `lm_eval` is importable: installing lm-eval into the project's environment would
downgrade a package already there (docs/compatibility.md, "Echo"), so it is not a dependency."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from conftest import MODEL_NAME, fetch_record

lm_eval = pytest.importorskip(
    "lm_eval",
    reason="lm-eval is not installed (it would downgrade python-dateutil in the project's "
    "environment: docs/compatibility.md, Echo); install it elsewhere on PYTHONPATH to run this",
)
from lm_eval.tasks import TaskManager  # noqa: E402

TASK = "rlgw_tiny_loglikelihood"
DOCS = [
    {"context": "The capital of France is", "continuation": " Paris"},
    {"context": "One, two,", "continuation": " three"},
    {"context": "Hello", "continuation": " world, again"},
]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local task: three lines of JSON, scored by log-likelihood."""
    root = tmp_path_factory.mktemp("lm-eval-task")
    data = root / "tiny.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (root / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: loglikelihood\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_target: "{{continuation}}"\n'
        "metric_list:\n"
        "  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return root


def evaluate(base_url: str, tokenizer_dir: Path, task_dir: Path) -> list[dict]:
    """lm-eval's samples of the task, scored by the completions endpoint at `base_url`."""
    args = (
        f"model={MODEL_NAME},base_url={base_url},tokenizer_backend=huggingface,"
        f"tokenizer={tokenizer_dir},tokenized_requests=True,num_concurrent=1,max_retries=1"
    )
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
    )
    return sorted(out["samples"][TASK], key=lambda s: s["doc_id"])


def test_lm_eval_scores_through_the_gateway_as_against_vllm(
    gateway_url, vllm_url, tiny_model_dir, task_dir, admin_http, monkeypatch
):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    session = httpx.post(f"{gateway_url}/v1/sessions", json={"train": False}).json()
    ours = evaluate(f"{session['base_url']}/completions", tiny_model_dir, task_dir)
    theirs = evaluate(f"{vllm_url}/v1/completions", tiny_model_dir, task_dir)

    assert len(ours) == len(DOCS)
    assert [s["resps"] for s in ours] == [s["resps"] for s in theirs]
    for sample in ours:  # one request per doc, one response: (log-likelihood, is greedy)
        loglikelihood, _greedy = sample["resps"][0][0]
        assert loglikelihood < 0.0

    detail = httpx.get(f"{gateway_url}/v1/sessions/{session['id']}").json()
    assert len(detail["completions"]) == len(DOCS)
    for summary in detail["completions"]:
        record = fetch_record(admin_http, summary["id"])
        assert record["request"]["echo"] is True and record["status"] == "complete"
        assert len(record["output_token_ids"]) == len(record["output_logprobs"]) == 1
        assert record["ineligible_reasons"] == [], record["ineligible_reasons"]
