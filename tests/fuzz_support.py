"""Schemathesis against the gateway's own OpenAPI spec, in process (ASGI), on a real database and a
fake vLLM upstream. Used by tests/test_fuzz.py (bounded) and tools/fuzz.py (longer runs).

About half the generated cases (a boolean hypothesis draws with each case) have the `model` of
their body replaced by the served one, so generated bodies get past the model lookup and reach the
upstream, the recording and, for the Responses and Messages APIs, the translation of the reply.

What counts as a failure: a 5xx, a traceback (or a Python file path) in any body, a response that
is not JSON where JSON is served, or any change to rows that existed before the run (another
tenant's session, completion, reward and key, the models and backends). The fuzzer sends the
credentials of a tenant of its own plus the admin key, so it reaches the code behind auth; the
tenant boundary itself is covered by tests/test_auth.py.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.python import asgi as st_asgi
from sqlalchemy import create_engine, text

from gateway.main import create_app
from rlgw import agent_keys
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.settings import Settings

from fakes import FAKE_MODEL, fake_backend_database, vllm_like

ADMIN_KEY = "fuzz-admin-key-0123456789abcdef"
TOKEN_SECRET = "fuzz-token-secret-0123456789abcdefghij"
# Changes the routing state of the only backend by design (then every completion waits for an
# active one): exercised by tests/test_weight_swap.py instead.
SKIPPED = {("POST", "/admin/backends/{backend_id}/drain")}
_TRACEBACK = re.compile(r'Traceback \(most recent call last\)|File "[^"]+\.py", line \d+')
# Rows that must not change, by table: (key columns, columns compared).
_WATCHED = {
    "sessions": "id, tenant, status, closed_at, metadata::text, group_id, train",
    "completions": "id, session_id, status, ineligible_reasons::text, orphan_reason, "
    "output_token_ids, request::text",
    "rewards": "id, session_id, completion_id, value, idempotency_key",
    "agent_keys": "id, tenant, key_hash, revoked_at",
    "models": "id, name, path, current_version",
    "backends": "id, model_id, url, state, served_version",
    "policy_versions": "id, model_id, version, weights_path",
}


@dataclass
class FuzzReport:
    operations: int = 0
    fuzzed: list[str] = field(default_factory=list)  # "METHOD /path" of each operation fuzzed
    cases: int = 0
    cases_by_operation: Counter = field(default_factory=Counter)
    status_by_operation: dict[str, Counter] = field(default_factory=dict)
    by_status: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    changed_rows: list[str] = field(default_factory=list)
    impossible: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "cases": self.cases,
            "by_status": dict(sorted(self.by_status.items())),
            "failures": len(self.failures),
            "changed_rows": len(self.changed_rows),
            "no_cases_possible": self.impossible,
            "seconds": round(self.seconds, 1),
        }


FAKE_VOCAB_SIZE = 4096  # the stand-in's vocabulary: token ids 0..4095


def _out_of_vocabulary(prompt: Any) -> int | None:
    """The first token id of a prompt given as ids (a list, or a batch of one) that vLLM would
    refuse as out of vocabulary."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list):
        return None
    for token in prompt:
        if type(token) is int and not 0 <= token < FAKE_VOCAB_SIZE:
            return token
    return None


def _upstream() -> Callable[[httpx.Request], Any]:
    """tests/fakes.py's vLLM stand-in, plus what a fuzzed call can also ask of a real vLLM:
    `/tokenize` (Messages count_tokens), `n` choices (one per index, streamed or not), and vLLM's
    400 for prompt token ids outside the vocabulary (vllm/renderers/base.py validate_token_ids:
    negative or too large)."""
    inner = vllm_like()

    async def handler(request: httpx.Request) -> httpx.Response:
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            body = None
        if request.url.path == "/tokenize" and request.method == "POST":
            return httpx.Response(200, json={"count": 3, "tokens": [1, 2, 3], "max_model_len": 64})
        bad_id = _out_of_vocabulary(body.get("prompt") if isinstance(body, dict) else None)
        if bad_id is not None:
            error = {
                "message": f"Token id {bad_id} is out of vocabulary",
                "type": "BadRequestError",
                "param": "prompt",
                "code": 400,
            }
            return httpx.Response(400, json={"error": error})
        response = await inner(request)
        n = body.get("n") if isinstance(body, dict) else None
        if response.status_code != 200 or type(n) is not int or n <= 1:
            return response
        if "text/event-stream" in response.headers.get("content-type", ""):
            lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
            out = []
            for line in lines:
                chunk = json.loads(line[len("data: ") :])
                for i in range(n):
                    one = {**chunk, "choices": [{**c, "index": i} for c in chunk["choices"]]}
                    out.append(b"data: " + json.dumps(one).encode() + b"\n\n")
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                content=b"".join([*out, b"data: [DONE]\n\n"]),
            )
        reply = response.json()
        reply["choices"] = [{**reply["choices"][0], "index": i} for i in range(n)]
        return httpx.Response(200, json=reply)

    return handler


def _snapshot(url: str) -> dict[str, set[tuple]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table: {tuple(r) for r in conn.execute(text(f"SELECT {cols} FROM {table}"))}
                for table, cols in _WATCHED.items()
            }
    finally:
        engine.dispose()


def _seed(url: str, app: Any) -> dict[str, str]:
    """A victim tenant with a session, a completion and a reward; a key for the fuzzer."""
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as db, db.begin():
        _, victim = agent_keys.mint(db, "victim")
        _, fuzzer = agent_keys.mint(db, "fuzzer")
    engine.dispose()
    with st_asgi.get_client(app) as client:
        auth = {"Authorization": f"Bearer {victim}"}
        session = client.post("/v1/sessions", json={"id": "victim-1"}, headers=auth).json()
        done = client.post(
            f"/sessions/{session['id']}/v1/chat/completions",
            json={"model": FAKE_MODEL, "messages": [{"role": "user", "content": "secret"}]},
            headers=auth,
        ).json()
        client.post(f"/v1/sessions/{session['id']}/rewards", json={"value": 1.0}, headers=auth)
    return {"victim": victim, "fuzzer": fuzzer, "victim_completion": done["id"]}


def run_fuzz(
    make_database: Callable[[], str],
    *,
    max_examples: int,
    seed_value: int = 0,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    log: Callable[[str], None] | None = None,
) -> FuzzReport:
    started = time.monotonic()
    url = fake_backend_database(make_database)
    app = create_app(
        Settings(
            database_url=url,
            admin_key=ADMIN_KEY,
            token_secret=TOKEN_SECRET,
            home=Path("/nonexistent"),
            auth="on",
            rate_limit_rps=0,  # limits are tested on their own; here they would only mask
            max_concurrency_per_key=0,
            max_body_bytes=256 * 1024,
        ),
        upstream_transport=httpx.MockTransport(_upstream()),
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    creds = _seed(url, app)
    before = _snapshot(url)
    headers = {"Authorization": f"Bearer {creds['fuzzer']}", "X-Admin-Key": ADMIN_KEY}
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in SKIPPED:
            continue
        report.operations += 1
        report.fuzzed.append(f"{operation.method.upper()} {operation.path}")
        for mode in modes:
            _fuzz_operation(operation, mode, headers, max_examples, seed_value, report)
        if log:
            log(f"{operation.method.upper()} {operation.path}: {report.cases} cases so far")
    after = _snapshot(url)
    for table, rows in before.items():
        for row in rows - after[table]:
            report.changed_rows.append(f"{table}: {row!r} changed or vanished")
    st_asgi.shutdown_lifespans()
    report.seconds = time.monotonic() - started
    return report


def _pin_model(case: Any) -> None:
    """Name the served model in a body that names one as a string: a generated name is never
    served (404 before the backend is asked), so without this no generated call would reach the
    upstream, the recording or the translation of a reply back (Responses, Messages)."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        case.body = {**body, "model": FAKE_MODEL}


def _fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    headers: dict[str, str],
    max_examples: int,
    seed_value: int,
    report: FuzzReport,
) -> None:
    name = f"{operation.method.upper()} {operation.path}"
    label = f"{name} [{mode.value}]"

    @seed(seed_value)
    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), pin=st.booleans())
    def fuzz(case: Any, pin: bool) -> None:
        report.cases += 1
        report.cases_by_operation[name] += 1
        if pin:
            _pin_model(case)
        try:
            response = case.call(headers=headers, timeout=30)
        except Exception as exc:  # the app raised through the transport: a failure too
            report.failures.append(f"{label}: request raised {type(exc).__name__}: {exc}")
            return
        status = response.status_code
        report.by_status[status] += 1
        report.status_by_operation.setdefault(name, Counter())[status] += 1
        body = response.content.decode("utf-8", errors="replace")
        if status >= 500:
            report.failures.append(f"{label}: HTTP {status} for {case.as_curl_command()}")
        if _TRACEBACK.search(body):
            report.failures.append(f"{label}: traceback in the body of HTTP {status}")
        content_type = response.headers.get("content-type", [""])
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        if status != 200 or "text/event-stream" not in content_type:
            try:
                response.json()
            except ValueError:
                report.failures.append(f"{label}: HTTP {status} body is not JSON: {body[:200]}")

    try:
        fuzz()
    except Unsatisfiable:  # e.g. no invalid input exists for an operation without parameters
        report.impossible.append(label)
