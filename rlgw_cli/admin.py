"""Commands on the database: migrations, agent keys, backend registration, trajectory export."""

from __future__ import annotations

import argparse
import json

from sqlalchemy import select

from migrations import runner as migrate
from rlgw import agent_keys
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import AgentKey, RegisteredModel
from rlgw.export import export_command, parse_since
from rlgw.governance import audit, consent
from rlgw.model_dir import inspect_model_dir
from rlgw.registry import RegistrationError, register_backend
from rlgw.settings import Settings

from .database import ready_database_url, resolve_database_url
from .output import CommandError, info


def cmd_db(args: argparse.Namespace) -> int:
    url = resolve_database_url(Settings())
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "base")
    else:
        migrate.current(url)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    settings = Settings()
    model_path = str(inspect_model_dir(args.path).path) if args.path else None
    engine = make_sync_engine(ready_database_url(settings))
    try:
        backend_id = register_backend(
            sync_session_factory(engine),
            args.model,
            args.url,
            model_path=model_path,
            allowlist=settings.backend_allowlist,
            trust_target=args.skip_allowlist,
        )
    except RegistrationError as exc:
        raise CommandError(f"not registered: {exc}", code=2) from None
    finally:
        engine.dispose()
    info(f"[rlgw] backend {backend_id}: {args.url} serves {args.model}")
    return 0


def _key_consent(db, args: argparse.Namespace, default: str) -> None:
    """Show, or with --models set, an agent key's training consent (printed as JSON)."""
    key = db.get(AgentKey, args.id)
    if key is None:
        raise CommandError(f"no agent key {args.id}", code=2)
    if args.models is None:
        policy = consent.key_effective(db, key, default)
    else:
        models = args.models.strip()
        wanted: consent.KeyModels
        if models in (consent.INHERIT, consent.NONE):
            wanted = models  # type: ignore[assignment]
        else:
            wanted = [m.strip() for m in models.split(",") if m.strip()]
            if not wanted:
                raise CommandError("--models is inherit, none, or model names (M1,M2)", code=2)
            unknown = sorted(set(wanted) - set(db.scalars(select(RegisteredModel.name))))
            if unknown:
                raise CommandError(f"no model named {', '.join(unknown)}", code=2)
        policy = consent.put_key(db, key, wanted, audit.command_actor(), default)
        info(f"[rlgw] agent key {key.id}: its sessions may train {policy.effective}")
    print(json.dumps(vars(policy)))


def cmd_keys(args: argparse.Namespace) -> int:
    settings = Settings()
    engine = make_sync_engine(ready_database_url(settings))
    try:
        with sync_session_factory(engine)() as db, db.begin():
            if args.action == "create":
                row, key = agent_keys.mint(db, args.tenant, args.name)
                if not args.quiet:
                    info(f"[rlgw] agent key {row.id} of tenant {row.tenant} (shown once):")
                print(key)
            elif args.action == "list":
                for row in agent_keys.list_keys(db, args.tenant):
                    state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "live"
                    print(f"{row.id}  {row.tenant}  {row.hint}...  {state}  {row.name or ''}")
            elif args.action == "consent":
                _key_consent(db, args, settings.training_consent)
            else:
                row = agent_keys.revoke(db, args.id)
                if row is None:
                    raise CommandError(f"no agent key {args.id}")
                info(f"[rlgw] agent key {row.id} revoked, with its session tokens")
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None
    finally:
        engine.dispose()
    return 0


def _iso_time(value: str):
    try:
        return parse_since(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {value!r} (e.g. 2026-11-29T14:00:00Z)"
        ) from None


def cmd_export(args: argparse.Namespace) -> int:
    return export_command(
        ready_database_url(Settings()),
        session_id=args.session,
        group_id=args.group,
        since=args.since,
        out_path=args.out,
        view=args.view,
    )


def add_commands(add) -> None:
    p = add("db", cmd_db, "Apply or inspect database migrations.")
    p.add_argument("action", choices=["upgrade", "downgrade", "current"])
    p.add_argument("revision", nargs="?", default=None, help="default: head / base")

    p = add("register", cmd_register, "Register a running vLLM server as a backend of a model.")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8100")
    p.add_argument("--path", default=None, help="the model's base checkpoint directory")
    p.add_argument(
        "--skip-allowlist",
        action="store_true",
        help="register a URL outside RLGW_BACKEND_ALLOWLIST (the other network rules still apply)",
    )

    p = add("keys", cmd_keys, "Mint, list or revoke agent keys (each bound to one tenant).")
    p.add_argument("action", choices=["create", "list", "revoke", "consent"])
    p.add_argument("--tenant", help="create: the key's tenant (required); list: only this one")
    p.add_argument("--name", default=None, help="create: a label for the key")
    p.add_argument("--id", help="revoke, consent: the key's id (ak_...)")
    p.add_argument(
        "--models",
        default=None,
        help="consent: inherit (the tenant's consent), none, or M1,M2: the most the key's "
        "sessions may train (never more than the tenant's); without it, show the key's consent",
    )
    p.add_argument("--quiet", action="store_true", help="create: print the key alone")

    p = add("export", cmd_export, "Write session trajectories as JSON Lines (one per session).")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", help="one session id")
    which.add_argument("--group", help="every session of a group")
    which.add_argument(
        "--since",
        type=_iso_time,
        help="every session created since this ISO 8601 time (UTC when it has no zone)",
    )
    p.add_argument("--out", default="-", help="output file (default: standard output)")
    p.add_argument(
        "--view",
        choices=["record", "training"],
        default="record",
        help="record: the trajectories as recorded (default); training: the sequences the "
        "trainer builds from each session (docs/api.md, the training view)",
    )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rules argparse cannot express."""
    if args.command == "keys" and args.action == "create" and not args.tenant:
        parser.error("keys create needs --tenant")
    if args.command == "keys" and args.action in ("revoke", "consent") and not args.id:
        parser.error(f"keys {args.action} needs --id")
