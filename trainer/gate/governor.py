"""The gate's judgement of a model's candidates: its evaluation, then an optional canary, then a
verdict (trainer/gate/verdicts.py) that promotes or rejects it.

    recorded as candidate -> swapped onto one backend (the others keep serving the promoted one)
        -> evaluation through the gateway, pinned to the candidate
            fails  -> rejected: that backend gets the promoted version back (full weights, verified)
            passes -> [canary: new sessions pinned to it, live rewards vs the promoted version's]
                   -> promoted: current_version moves, the other backends get it (verified)

Every verdict is written with its scores (`policy_versions.status`, `.gate_report`) and to the
audit log, and announced to the gateways (NOTIFY) in the transaction that decides it. The scores
of each version on each evaluation are kept in its gate report (`scores`, by digest).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch
from sqlalchemy import select

from rlgw import backend_state as bs
from rlgw.db.models import PolicyVersion, PromotionGate, RegisteredModel
from rlgw.governance.canary_metrics import canary_metrics
from rlgw.settings import Settings

from ..backends.parity import ProbeScores
from ..publishing.publish import Published, Publisher
from ..publishing.rollback import carry_out_pending
from .run_eval import GateError, GatewayEval
from .verdicts import Verdict, Verdicts


class Governor:
    """The gate of one model, run by its trainer."""

    def __init__(
        self, settings: Settings, publisher: Publisher, *, log: Callable[[str], None] = print
    ) -> None:
        self.settings, self.publisher, self.log = settings, publisher, log
        self.db_sessions = publisher.db_sessions
        self.model_id, self.model_name = publisher.model.id, publisher.model.name
        self.evaluator = GatewayEval(settings, self.db_sessions, self.model_name, log=log)
        self.verdicts = Verdicts(publisher, log=log)

    def _state(self) -> tuple[RegisteredModel, PromotionGate | None]:
        with self.db_sessions() as db:
            return db.get(RegisteredModel, self.model_id), db.get(PromotionGate, self.model_id)

    def _row(self, db, version: int) -> PolicyVersion:
        return db.scalar(
            select(PolicyVersion).where(
                PolicyVersion.model_id == self.model_id, PolicyVersion.version == version
            )
        )

    # ------------------------------------------------------------------ scores
    def _score(self, version: int, digest: str) -> float | None:
        with self.db_sessions() as db:
            report = self._row(db, version).gate_report or {}
        return report.get("scores", {}).get(digest)

    def _keep_score(self, version: int, digest: str, score: float) -> None:
        with self.db_sessions() as db, db.begin():
            row = self._row(db, version)
            report = dict(row.gate_report or {})
            report["scores"] = {**report.get("scores", {}), digest: score}
            row.gate_report = report

    def baseline(self, head: int) -> None:
        """Before an update: the promoted version's score, which `--max-drop` compares with,
        measured once per evaluation while it still serves (a candidate's own score is the
        next baseline once it is promoted)."""
        _, gate = self._state()
        if gate is None or gate.max_drop is None or self._score(head, gate.eval_digest) is not None:
            return
        try:
            result = self.evaluator.run(head, gate.eval_items, eval_name=gate.eval_name)
        except GateError as exc:  # judged without a baseline: rejected, with this reason
            self.log(f"[gate] no baseline score of version {head}: {exc}")
            return
        self._keep_score(head, gate.eval_digest, result.score)

    def _passes(self, gate: PromotionGate, score: float, parent: int) -> tuple[bool, str]:
        if gate.min_score is not None:
            ok = score >= gate.min_score
            return ok, f"scored {score:.4f}, {'not below' if ok else 'below'} {gate.min_score:g}"
        base = self._score(parent, gate.eval_digest)
        if base is None:
            return False, f"no score of the promoted version {parent} on this evaluation"
        ok = score >= base - gate.max_drop
        return ok, (
            f"scored {score:.4f} against {base:.4f} of version {parent}: "
            f"{'within' if ok else 'more than'} the allowed drop of {gate.max_drop:g}"
        )

    # ------------------------------------------------------------------ judging
    def judge(
        self, published: Published, model: torch.nn.Module, reference_old: ProbeScores
    ) -> Verdict:
        """The candidate now on its gate backend: evaluate it, then promote it, reject it, or
        start its canary."""
        version, parent = published.version, published.parent
        _, gate = self._state()
        report: dict[str, Any] = {"parent": parent}
        if gate is None:
            return self.verdicts.reject(version, report, "the gate was cleared while it judged")
        try:
            result = self.evaluator.run(version, gate.eval_items, eval_name=gate.eval_name)
        except GateError as exc:
            return self.verdicts.reject(version, report, f"the evaluation could not be run: {exc}")
        self._keep_score(version, gate.eval_digest, result.score)
        report["eval"] = result.summary(gate.eval_name, gate.eval_digest)
        passed, reason = self._passes(gate, result.score, parent)
        report["eval"]["baseline"] = self._score(parent, gate.eval_digest)
        if not passed:
            return self.verdicts.reject(version, report, reason)
        if gate.canary:
            return self._start_canary(version, parent, gate, report, reason)
        return self.verdicts.promote(
            version, report, reason, model=model, reference_old=reference_old
        )

    def _start_canary(
        self, version: int, parent: int, gate: PromotionGate, report: dict, passed: str
    ) -> Verdict:
        in_service = [
            b
            for b in self.publisher.coordinator.backends(self.model_id)
            if b.state == bs.ACTIVE and b.served_version is not None
        ]
        if len(in_service) < 2:
            return self.verdicts.reject(
                version,
                report,
                f"evaluation passed ({passed}), but a canary needs two backends in service "
                f"and {self.model_name} has {len(in_service)}",
            )
        share = gate.canary_percent / 100 if gate.canary == "sessions" else 1 / len(in_service)
        started = datetime.now(UTC)
        with self.db_sessions() as db, db.begin():
            model = db.get(RegisteredModel, self.model_id, with_for_update=True)
            if model.candidate_version != version:
                return Verdict(version, "superseded", model.current_version, "decided elsewhere")
            model.canary_share, model.canary_started_at = share, started
            row = self._row(db, version)
            canary = {"mode": gate.canary, "share": share, "started_at": started.isoformat()}
            row.gate_report = {**(row.gate_report or {}), **report, "canary": canary}
            db.execute(bs.NOTIFY, bs.model_notify_args(self.model_id))
        self.log(f"[gate] version {version} passed its evaluation; canary on {share:.0%}")
        return Verdict(version, "canary", parent, f"evaluation passed ({passed}); canary running")

    def poll(self) -> Verdict | None:
        """A running canary: judged once both sides have enough rewarded sessions, rolled back
        after its timeout. None when no candidate is being judged."""
        model, gate = self._state()
        if model.candidate_version is None or model.canary_started_at is None:
            return None
        version, parent = model.candidate_version, model.current_version
        if gate is None:
            return self.verdicts.reject(version, {}, "the gate was cleared while its canary ran")
        with self.db_sessions() as db:
            metrics = canary_metrics(db, model, self.settings.training_consent)
        assert metrics is not None
        report = {"canary_metrics": metrics.as_dict()}
        need = gate.canary_sessions
        if metrics.canary_sessions >= need and metrics.control_sessions >= need:
            ok = metrics.canary_mean >= metrics.control_mean - gate.canary_max_drop
            reason = (
                f"canary mean reward {metrics.canary_mean:.4f} over {metrics.canary_sessions} "
                f"sessions against {metrics.control_mean:.4f} over {metrics.control_sessions} of "
                f"version {parent}: {'within' if ok else 'more than'} the allowed drop of "
                f"{gate.canary_max_drop:g}"
            )
            return (self.verdicts.promote if ok else self.verdicts.reject)(version, report, reason)
        age = (datetime.now(UTC) - model.canary_started_at).total_seconds()
        if age > gate.canary_timeout_s:
            return self.verdicts.reject(
                version,
                report,
                f"canary timed out after {gate.canary_timeout_s:g} s with "
                f"{metrics.canary_sessions} canary and {metrics.control_sessions} promoted "
                "sessions rewarded "
                f"({need} needed on each side)",
            )
        return Verdict(version, "canary", parent, "canary running")

    def tick(self) -> bool:
        """Before an update: carry out the rollbacks asked for over the admin API, and settle a
        running canary. False while a candidate is still being judged (no training meanwhile:
        the next version must be built on a promoted one)."""
        carry_out_pending(self.publisher, log=self.log)
        verdict = self.poll()
        return verdict is None or verdict.outcome != "canary"

    def recover(self) -> None:
        """At the trainer's start: a candidate whose evaluation was cut off is rejected (its
        canary, which lives in the database, goes on)."""
        model, _ = self._state()
        if model.candidate_version is not None and model.canary_started_at is None:
            self.verdicts.reject(
                model.candidate_version, {}, "the trainer stopped before the gate decided"
            )
