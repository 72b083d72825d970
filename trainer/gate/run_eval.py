"""Running the gate's evaluation through the gateway, on sessions pinned to one version.

Decision: the evaluation goes through the gateway, not straight to a backend. The gateway then
records every evaluation completion exactly as it records any traffic (token ids, log-probs,
the version that served it, eligibility), so the gate's evidence is in the learning record and
its scores can be audited against it; and the candidate is tested on the path it will serve.
The sessions are written by the trainer before their first call: `train: false`, tenant
`rlgw-gate`, pinned to the version judged (`sessions.pinned_version`), so the gateway routes them
to the backend holding it, which serves no other traffic meanwhile. They are never claimed
(`train` is false) and the check after the run proves every answer came from that version.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from rlgw import agent_keys
from rlgw.db.models import Completion
from rlgw.session_rows import insert_named
from rlgw.settings import Settings

from .evaluation import score

GATE_TENANT = "rlgw-gate"
# The gateway learns of the candidate's backend from its registry listener, within moments of
# the swap; until then (or while a backend is held) a pinned call may be refused: retry meanwhile.
CATCH_UP_S = 30.0
RETRIED = {409, 503}


class GateError(RuntimeError):
    """The evaluation could not be run (the gateway refused, or another version answered)."""


@dataclass
class EvalResult:
    version: int
    score: float
    scores: list[float] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)

    def summary(self, name: str, digest: str) -> dict[str, Any]:
        return {
            "name": name,
            "digest": digest,
            "version": self.version,
            "score": self.score,
            "items": len(self.scores),
            "scores": self.scores,
            "sessions": self.session_ids,
        }


class GatewayEval:
    """Runs evaluation prompts through the gateway at `settings.base_url` (RLGW_PUBLIC_URL)."""

    def __init__(
        self,
        settings: Settings,
        db_sessions: sessionmaker[Session],
        model_name: str,
        *,
        log: Callable[[str], None] = print,
    ) -> None:
        self.base_url, self.db_sessions, self.model_name, self.log = (
            settings.base_url,
            db_sessions,
            model_name,
            log,
        )

    def run(self, version: int, items: list[dict[str, Any]], *, eval_name: str) -> EvalResult:
        """Score `version` on `items`; raises GateError when it cannot be done faithfully."""
        tag = uuid.uuid4().hex[:12]
        with self.db_sessions() as db, db.begin():
            key_row, key = agent_keys.mint(db, GATE_TENANT, f"gate of {self.model_name}")
        result = EvalResult(version, 0.0)
        try:
            with httpx.Client(
                base_url=self.base_url, timeout=120, headers={"Authorization": f"Bearer {key}"}
            ) as http:
                for index, item in enumerate(items):
                    session_id = f"gate-{tag}-v{version}-{index}"
                    self._open(session_id, version, eval_name, index)
                    answer = self._answer(http, session_id, item)
                    value = score(item, answer)
                    self._call(http, "POST", f"/v1/sessions/{session_id}/rewards", {"value": value})
                    self._call(http, "POST", f"/v1/sessions/{session_id}/close", None)
                    result.scores.append(value)
                    result.session_ids.append(session_id)
        except httpx.HTTPError as exc:
            raise GateError(f"the gateway at {self.base_url} could not be reached: {exc}") from exc
        finally:
            with self.db_sessions() as db, db.begin():
                agent_keys.revoke(db, key_row.id)
        self._check_served(result, version)
        result.score = sum(result.scores) / len(result.scores)
        self.log(
            f"[gate] version {version} scores {result.score:.3f} on {eval_name} "
            f"({len(result.scores)} prompts)"
        )
        return result

    def _open(self, session_id: str, version: int, eval_name: str, index: int) -> None:
        with self.db_sessions() as db, db.begin():
            db.execute(
                insert_named(
                    id=session_id,
                    tenant=GATE_TENANT,
                    train=False,
                    task_id=f"gate:{eval_name}"[-256:],
                    meta={"gate": {"model": self.model_name, "version": version, "item": index}},
                    pinned_model=self.model_name,
                    pinned_version=version,
                )
            )

    def _answer(self, http: httpx.Client, session_id: str, item: dict[str, Any]) -> str:
        body = {
            "model": self.model_name,
            "messages": item["messages"],
            "max_tokens": item["max_tokens"],
            "temperature": 0.0,
        }
        reply = self._call(http, "POST", f"/sessions/{session_id}/v1/chat/completions", body)
        return reply["choices"][0]["message"].get("content") or ""

    def _call(self, http: httpx.Client, method: str, path: str, body: Any) -> Any:
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            reply = http.request(method, path, json=body)
            if reply.status_code < 300:
                return reply.json()
            if reply.status_code not in RETRIED or time.monotonic() > deadline:
                raise GateError(
                    f"the gateway answered {reply.status_code} to {method} {path}: "
                    f"{reply.text[:300]}"
                )
            time.sleep(0.5)

    def _check_served(self, result: EvalResult, version: int) -> None:
        """Every evaluation completion was served by `version` (the pin held), every output token
        of it (a swap that continued an answer on other weights shows in its output_versions)."""
        with self.db_sessions() as db:
            rows = db.execute(
                select(Completion.policy_version, Completion.output_versions).where(
                    Completion.session_id.in_(result.session_ids),
                    Completion.status == "complete",
                )
            ).all()
        served = {v for first, per_token in rows for v in (per_token or [first])}
        if served != {version}:
            raise GateError(
                f"evaluation answers came from versions {sorted(served)}, not {version}"
            )
