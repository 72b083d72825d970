"""The `rlgw` command: set up, serve, train and inspect the gateway."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from pydantic import ValidationError

from rlgw.backend_launcher import BackendError
from rlgw.db.faults import is_connection_error
from rlgw.model_dir import ModelDirError

from . import admin, demo, governance, models, serve, train, up
from .database import SchemaOutOfDate
from .output import CommandError

Handler = Callable[[argparse.Namespace], int]
COMMAND_MODULES = (up, demo, serve, models, admin, train, governance)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlgw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    for module in COMMAND_MODULES:
        module.add_commands(add)
    return parser


def _expected_failure(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit code for a failure a user can cause or meet; None for a bug."""
    if isinstance(exc, CommandError):
        return str(exc), exc.code
    if isinstance(exc, SchemaOutOfDate | ModelDirError):
        return str(exc), 2
    if isinstance(exc, BackendError):  # vLLM did not start: its log says why
        return str(exc), 1
    if isinstance(exc, ValidationError) and exc.title == "Settings":  # an RLGW_* value refused
        first = exc.errors()[0]
        where = "_".join(str(part) for part in first["loc"]).upper()
        return f"invalid setting{' RLGW_' + where if where else 's'}: {first['msg']}", 2
    if is_connection_error(exc):
        cause = getattr(exc, "orig", None) or exc
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        return f"cannot reach the database: {first}", 1
    return None


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for commands that re-launch
    admin.check_args(parser, args)
    try:
        code = args.handler(args)
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        failure = _expected_failure(exc)
        if failure is None:
            raise
        message, code = failure
        print(f"rlgw {args.command}: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
