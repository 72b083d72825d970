"""The `rlgw` command: set up, serve, and inspect the gateway."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from rlgw.settings import Settings

Handler = Callable[[argparse.Namespace], int]


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k in ("host", "port") if (v := getattr(args, k, None)) is not None}
    return Settings(**overrides)


def cmd_init_model(args: argparse.Namespace) -> int:
    from trainer.init_model import create_model

    create_model(Path(args.out), preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    return 0


def cmd_backend(args: argparse.Namespace) -> int:
    from rlgw.backend_launcher import run_backend_foreground

    return run_backend_foreground(
        args.model, args.port, host=args.host, served_model_name=args.name, platform=args.platform
    )


def cmd_db(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from rlgw.db import migrate

    url = resolve_database_url(Settings())
    {"upgrade": migrate.upgrade, "downgrade": migrate.downgrade, "current": migrate.current}[
        args.action
    ](url, *([args.revision] if args.action != "current" else []))
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from rlgw.db.engine import make_sync_engine, sync_session_factory
    from rlgw.registry import RegistrationError, register_backend

    settings = Settings()
    engine = make_sync_engine(resolve_database_url(settings))
    try:
        backend_id = register_backend(
            sync_session_factory(engine),
            args.model,
            args.url,
            model_path=args.path,
            allowlist=settings.backend_allowlist,
            trust_target=args.skip_allowlist,
        )
    except RegistrationError as exc:
        print(f"[rlgw] not registered: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    print(f"[rlgw] backend {backend_id}: {args.url} serves {args.model}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from rlgw import agent_keys
    from rlgw.database import resolve_database_url
    from rlgw.db.engine import make_sync_engine, sync_session_factory

    engine = make_sync_engine(resolve_database_url(Settings()))
    try:
        with sync_session_factory(engine)() as db, db.begin():
            if args.action == "create":
                row, key = agent_keys.mint(db, args.tenant, args.name)
                if args.quiet:
                    print(key)
                else:
                    print(f"[rlgw] agent key {row.id} of tenant {row.tenant} (shown once):")
                    print(key)
            elif args.action == "list":
                for row in agent_keys.list_keys(db, args.tenant):
                    state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "live"
                    print(f"{row.id}  {row.tenant}  {row.hint}...  {state}  {row.name or ''}")
            else:
                row = agent_keys.revoke(db, args.id)
                if row is None:
                    print(f"[rlgw] no agent key {args.id}", file=sys.stderr)
                    return 1
                print(f"[rlgw] agent key {row.id} revoked, with its session tokens")
    except ValueError as exc:
        print(f"[rlgw] {exc}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from rlgw.db.migrate import upgrade
    from rlgw.serve import run_gateway

    if args.workers < 1:
        print("[rlgw] --workers must be at least 1", file=sys.stderr)
        return 2
    settings = _settings(args)
    url = resolve_database_url(settings)
    upgrade(url)
    run_gateway(settings.model_copy(update={"database_url": url}), workers=args.workers)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from rlgw.up import run_up

    return run_up(
        _settings(args), backend_port=args.backend_port, preset=args.preset, seed=args.seed
    )


def _iso_time(value: str):
    from rlgw.export import parse_since

    try:
        return parse_since(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {value!r} (e.g. 2026-11-29T14:00:00Z)"
        ) from None


def cmd_export(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from rlgw.export import export_command

    return export_command(
        resolve_database_url(Settings()),
        session_id=args.session,
        group_id=args.group,
        since=args.since,
        out_path=args.out,
    )


def cmd_push(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from trainer.push import push

    settings = Settings()
    reports = push(
        settings,
        resolve_database_url(settings),
        args.model,
        delta=Path(args.delta) if args.delta else None,
        full_dir=Path(args.full) if args.full else None,
    )
    return 0 if reports and all(r.outcome == "swapped" for r in reports) else 1


TRAIN_FLAGS = (
    "lr",
    "batch_sessions",
    "min_sessions",
    "max_staleness",
    "anchor_every",
    "minibatches",
    "clip_eps",
    "imp_weight_cap",
    "seed",
)


def cmd_train(args: argparse.Namespace) -> int:
    from rlgw.database import resolve_database_url
    from rlgw.db.engine import make_sync_engine
    from trainer.config import TrainerConfig
    from trainer.service import OnlineTrainer

    settings = Settings()
    config = TrainerConfig(**{k: v for k in TRAIN_FLAGS if (v := getattr(args, k)) is not None})
    engine = make_sync_engine(resolve_database_url(settings))
    trainer = OnlineTrainer(settings, engine, args.model, config)
    try:
        trainer.run(poll_s=args.poll_s, max_versions=args.max_versions)
    except KeyboardInterrupt:
        print("[train] stopped")
    finally:
        trainer.close()
        engine.dispose()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rlgw.demo import DemoOptions, run_demo

    options = DemoOptions(
        seed=args.seed, minutes=args.minutes, sync=args.sync, out_dir=Path(args.out)
    )
    summary = run_demo(Settings(), options)
    return 0 if summary["gain"] > 0 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlgw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    p = add(
        "up", cmd_up, "Start everything on embedded defaults: Postgres, model, backend, gateway."
    )
    p.add_argument("--host", default=None, help="gateway bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="gateway port (default 8000)")
    p.add_argument("--backend-port", type=int, default=8100, help="vLLM port (default 8100)")
    p.add_argument(
        "--preset",
        default="tiny",
        choices=["tiny", "small", "bench-0.5b"],
        help="model preset created when missing",
    )
    p.add_argument("--seed", type=int, default=0, help="model seed")

    p = add("demo", cmd_demo, "Agents learn a task online through the gateway; plots the reward.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    p.add_argument(
        "--sync",
        action="store_true",
        help="synchronous baseline: no generation while the trainer trains",
    )
    p.add_argument("--out", default="demo-results", help="where the JSON and PNG go")

    p = add("serve", cmd_serve, "Run the gateway against the configured database.")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes sharing the port and the database (default 1)",
    )

    p = add("init-model", cmd_init_model, "Write a Qwen2-architecture model with a byte tokenizer.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "bench-0.5b"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing model")

    p = add("backend", cmd_backend, "Run a vLLM server for a model with the flags rlgw needs.")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default=None, help="served model name (default: directory name)")
    p.add_argument("--platform", choices=["cpu", "gpu"], default=None, help="default: detect")

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
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("--tenant", help="create: the key's tenant (required); list: only this one")
    p.add_argument("--name", default=None, help="create: a label for the key")
    p.add_argument("--id", help="revoke: the key's id (ak_...)")
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

    p = add("push", cmd_push, "Install new weights on every backend of a model, verified.")
    p.add_argument("--model", required=True, help="registered model name")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--delta", help="safetensors file of theta_new - theta_served (HF names)")
    what.add_argument("--full", help="checkpoint directory with the new weights")

    p = add("train", cmd_train, "Run the online trainer for a model until stopped.")
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--max-versions", type=int, default=None, help="stop after N versions")
    p.add_argument("--poll-s", type=float, default=0.5, help="wait between empty polls")
    for flag in TRAIN_FLAGS:
        kind = (
            int
            if flag
            in (
                "batch_sessions",
                "min_sessions",
                "max_staleness",
                "anchor_every",
                "minibatches",
                "seed",
            )
            else float
        )
        p.add_argument(
            "--" + flag.replace("_", "-"),
            type=kind,
            default=None,
            help=f"TrainerConfig.{flag} (see trainer/config.py)",
        )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "keys" and args.action == "create" and not args.tenant:
        parser.error("keys create needs --tenant")
    if args.command == "keys" and args.action == "revoke" and not args.id:
        parser.error("keys revoke needs --id")
    if args.command == "db" and args.revision is None:
        args.revision = "head" if args.action == "upgrade" else "base"
    sys.exit(args.handler(args))


if __name__ == "__main__":
    main()
