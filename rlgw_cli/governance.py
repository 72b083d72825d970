"""Commands on what may change a model: its promotion gate, rollbacks, and retention."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from sqlalchemy import func, select

from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import Backend, PromotionGate, RegisteredModel
from rlgw.governance import audit, retention, rollbacks
from rlgw.settings import Settings

from .database import ready_database_url
from .output import CommandError, info
from .train import trainer_errors


def _model(db, name: str) -> RegisteredModel:
    try:
        return rollbacks.model_named(db, name)
    except rollbacks.RollbackRefused as exc:
        raise CommandError(str(exc), code=2) from None


def _canary(value: str | None) -> tuple[str | None, float | None]:
    """`backend` or `sessions:PCT`."""
    if value is None:
        return None, None
    if value == "backend":
        return "backend", None
    kind, _, percent = value.partition(":")
    try:
        share = float(percent)
    except ValueError:
        share = -1.0
    if kind != "sessions" or not 0 < share <= 100:
        raise CommandError(
            f"--canary {value!r}: give backend or sessions:PCT with 0 < PCT <= 100", code=2
        )
    return "sessions", share


def _set_gate(db, model: RegisteredModel, args: argparse.Namespace) -> dict:
    from trainer.gate import evaluation

    if not args.eval:
        raise CommandError("gate set needs --eval FILE|TASK", code=2)
    if (args.min_score is None) == (args.max_drop is None):
        raise CommandError("gate set needs exactly one of --min-score or --max-drop", code=2)
    if args.min_score is not None and not 0 <= args.min_score <= 1:
        raise CommandError("--min-score is a mean score in [0, 1]", code=2)
    for flag in ("max_drop", "canary_max_drop", "canary_timeout_s"):
        if (getattr(args, flag) or 0) < 0:
            raise CommandError(f"--{flag.replace('_', '-')} cannot be negative", code=2)
    if args.canary_sessions < 1:
        raise CommandError("--canary-sessions must be at least 1", code=2)
    canary, percent = _canary(args.canary)
    backends = db.scalar(select(func.count()).where(Backend.model_id == model.id))
    if canary and backends < 2:
        raise CommandError(
            f"a canary needs two backends of {model.name}; it has {backends} (register another)",
            code=2,
        )
    try:
        name, items = evaluation.load(args.eval, args.items)
    except evaluation.EvalFormatError as exc:
        raise CommandError(str(exc), code=2) from None
    values = {
        "eval_name": name,
        "eval_digest": evaluation.digest(items),
        "eval_items": items,
        "min_score": args.min_score,
        "max_drop": args.max_drop,
        "canary": canary,
        "canary_percent": percent,
        "canary_sessions": args.canary_sessions,
        "canary_max_drop": (
            (args.max_drop or 0.0) if args.canary_max_drop is None else args.canary_max_drop
        ),
        "canary_timeout_s": args.canary_timeout_s,
        "set_by": audit.command_actor(),
    }
    gate = db.get(PromotionGate, model.id) or PromotionGate(model_id=model.id)
    for key, value in values.items():
        setattr(gate, key, value)
    db.add(gate)
    shown = {k: v for k, v in values.items() if k != "eval_items"} | {"eval_items": len(items)}
    audit.record(db, "gate_set", actor=values["set_by"], model=model.name, detail=shown)
    return shown


def cmd_gate(args: argparse.Namespace) -> int:
    engine = make_sync_engine(ready_database_url(Settings()))
    try:
        with sync_session_factory(engine)() as db, db.begin():
            model = _model(db, args.model)
            gate = db.get(PromotionGate, model.id)
            if args.action == "set":
                shown = _set_gate(db, model, args)
                info(f"[rlgw] {model.name}: new versions now pass this gate before serving all")
                print(json.dumps(shown, indent=2, default=str))
            elif args.action == "clear":
                if gate is None:
                    raise CommandError(f"{model.name} has no gate", code=2)
                db.delete(gate)
                audit.record(db, "gate_clear", actor=audit.command_actor(), model=model.name)
                info(f"[rlgw] {model.name}: gate cleared; new versions serve at once")
            else:
                shown = None
                if gate is not None:
                    shown = {
                        c.name: getattr(gate, c.name)
                        for c in PromotionGate.__table__.columns
                        if c.name not in ("eval_items", "model_id")
                    } | {"eval_items": len(gate.eval_items)}
                state = {
                    "model": model.name,
                    "current_version": model.current_version,
                    "candidate_version": model.candidate_version,
                    "canary_share": model.canary_share,
                    "gate": shown,
                }
                print(json.dumps(state, indent=2, default=str))
    finally:
        engine.dispose()
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from trainer.publishing.publish import Publisher
    from trainer.publishing.push import print_reports
    from trainer.publishing.rollback import carry_out

    settings = Settings()
    engine = make_sync_engine(ready_database_url(settings))
    try:
        with trainer_errors(), Publisher(settings, engine, args.model, log=info) as publisher:
            with publisher.db_sessions() as db, db.begin():
                try:
                    event = rollbacks.request(
                        db, args.model, args.to, actor=audit.command_actor(), reason=args.reason
                    )
                except rollbacks.RollbackRefused as exc:
                    raise CommandError(str(exc), code=2) from None
                request_id = event.id
            outcome = carry_out(publisher, request_id, log=info)
    finally:
        engine.dispose()
    if outcome is None or outcome.state == rollbacks.FAILED:
        raise CommandError(
            f"rollback {request_id} was not carried out: "
            f"{outcome.reason if outcome else 'a trainer took it first'}"
        )
    print_reports(outcome.swaps, info)
    info(
        f"[rlgw] {args.model}: version {outcome.from_version} -> {outcome.to_version} "
        f"(audit log entry {request_id})"
    )
    return 0 if all(r.outcome == "swapped" for r in outcome.swaps) else 1


def cmd_retention(args: argparse.Namespace) -> int:
    settings = Settings()
    text_days = settings.retention_text_days if args.text_days is None else args.text_days
    records_days = (
        settings.retention_records_days if args.records_days is None else args.records_days
    )
    for flag, days in (("--text-days", text_days), ("--records-days", records_days)):
        if days is not None and days < 0:
            raise CommandError(f"{flag} {days:g}: a retention period cannot be negative", code=2)
    if text_days is None and records_days is None:
        raise CommandError(
            "nothing to do: set RLGW_RETENTION_TEXT_DAYS or RLGW_RETENTION_RECORDS_DAYS, or give "
            "--text-days or --records-days",
            code=2,
        )
    engine = make_sync_engine(ready_database_url(settings))
    try:
        with engine.connect() as conn:
            result = retention.sweep(
                conn, text_days=text_days, records_days=records_days, now=datetime.now(UTC)
            )
    finally:
        engine.dispose()
    print(json.dumps(vars(result)))
    return 0


def add_commands(add) -> None:
    p = add("gate", cmd_gate, "Set, show or clear the promotion gate of a model.")
    p.add_argument("action", choices=["set", "show", "clear"])
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument(
        "--eval",
        help="set: a JSONL evaluation file (docs/governance.md) or a built-in task (copy4)",
    )
    p.add_argument("--items", type=int, default=None, help="set: prompts of a built-in task")
    p.add_argument("--min-score", type=float, default=None, help="set: pass at this mean score")
    p.add_argument(
        "--max-drop",
        type=float,
        default=None,
        help="set: pass at most this far below the promoted version's score",
    )
    p.add_argument(
        "--canary",
        default=None,
        help="set: then serve backend (one backend's share of new sessions) or sessions:PCT",
    )
    p.add_argument("--canary-sessions", type=int, default=20, help="rewarded sessions per side")
    p.add_argument(
        "--canary-max-drop",
        type=float,
        default=None,
        help="canary mean reward at most this below the promoted one's (default: --max-drop)",
    )
    p.add_argument("--canary-timeout-s", type=float, default=3600.0, help="then rolled back")

    p = add("rollback", cmd_rollback, "Put every backend of a model on an earlier version.")
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--to", type=int, required=True, help="the version to roll back to")
    p.add_argument("--reason", default=None, help="why (kept in the audit log)")

    p = add("retention", cmd_retention, "Apply the retention periods now.")
    p.add_argument("action", choices=["sweep"])
    p.add_argument("--text-days", type=float, default=None, help="RLGW_RETENTION_TEXT_DAYS")
    p.add_argument("--records-days", type=float, default=None, help="RLGW_RETENTION_RECORDS_DAYS")
