"""The update path imports with torch alone: no web, database or serving stack (a GPU box)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("fastapi", "sqlalchemy", "psycopg", "uvicorn", "vllm", "pydantic", "httpx")
UPDATE_PATH = (
    "trainer.loop.update",
    "trainer.loop.loss",
    "trainer.loop.samples",
    "trainer.loop.records",
    "trainer.loop.microbatch",
    "trainer.loop.device",
    "trainer.loop.collectives",
    "trainer.loop.distributed",
    "trainer.models.weights",
    "trainer.models.init_model",
    "trainer.models.model_families",
    "trainer.models.bpe_tokenizer",
)


def import_blocked(modules: tuple[str, ...]) -> subprocess.CompletedProcess:
    """Import `modules` in a fresh interpreter where every BLOCKED module fails to import."""
    code = (
        "import importlib, sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # `import name` now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_update_path_imports_without_the_web_and_database_stack() -> None:
    run = import_blocked(UPDATE_PATH)
    assert run.returncode == 0, run.stderr


def test_the_block_is_real() -> None:
    run = import_blocked(("rlgw.trajectory",))
    assert run.returncode != 0 and "halted; None in sys.modules" in run.stderr
