"""The layer contracts in pyproject.toml hold, and they fail when a wrong-way import appears."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = {
    "rlgw": "rlgw",
    "rlgw_cli": "rlgw_cli",
    "rlgw_vllm": "rlgw_vllm",
    "gateway": "gateway",
    "trainer": "trainer",
    "migrations": "migrations",
}

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The project's packages and contracts in a scratch directory, to break on purpose."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name, source in PACKAGES.items():
        shutil.copytree(ROOT / source, tmp_path / name, ignore=ignore)
    shutil.copytree(ROOT / "sdk", tmp_path / "rlgw_sdk", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_layer_contracts_hold() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "broken" not in done.stdout.lower().replace("0 broken", "")


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("rlgw/registry.py", "import gateway.errors", "only the composition root"),
        ("rlgw/rewards.py", "import trainer.loop.loss", "only the composition root"),
        (
            "gateway/limits.py",
            "import trainer.loop.loss",
            "gateway and trainer never import each other",
        ),
        (
            "trainer/loop/loss.py",
            "import gateway.errors",
            "gateway and trainer never import each other",
        ),
        ("rlgw/registry.py", "import rlgw_cli.output", "never imports the composition root"),
        ("gateway/responses/router.py", "import gateway.openai.surface", "three API surfaces"),
        ("gateway/proxy/routing.py", "import gateway.openai.router", "gateway's layers"),
        ("rlgw/db/engine.py", "import rlgw.registry", "no import circles"),
    ],
)
def test_a_wrong_way_import_breaks_a_contract(
    tree_copy: Path, module: str, bad_import: str, contract: str
) -> None:
    target = tree_copy / module
    target.write_text(target.read_text() + f"\n{bad_import}  # noqa\n")
    done = lint(tree_copy)
    assert done.returncode != 0
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout[-3000:]
