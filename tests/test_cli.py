"""The `rlgw` command as a user runs it: results on stdout, notices on stderr, a fresh state
directory that works for every command, and expected failures as one line, not a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from rlgw.agent_keys import looks_like_key
from rlgw.db.urls import to_libpq_uri
from rlgw.ports import free_port

RLGW = Path(sys.executable).parent / "rlgw"


def rlgw(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLGW_")}
    return subprocess.run(
        [str(RLGW), *argv], env={**base, **env}, capture_output=True, text=True, timeout=300
    )


def assert_one_line_failure(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    failure = [line for line in lines if line.startswith("rlgw ")]
    assert len(failure) == 1, done.stderr
    for word in words:
        assert word in failure[0], failure[0]
    assert done.stdout == ""


@pytest.mark.skipif(not RLGW.exists(), reason="the rlgw console script is not installed")
def test_keys_create_quiet_on_a_fresh_state_directory_prints_exactly_the_key(tmp_path: Path):
    pytest.importorskip("pgserver")
    done = rlgw("keys", "create", "--tenant", "local", "--quiet", env={"RLGW_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1
    key = done.stdout.strip()
    assert looks_like_key(key), done.stdout
    assert "embedded Postgres" in done.stderr  # the notice is there, but not in $(...)
    listed = rlgw("keys", "list", env={"RLGW_HOME": str(tmp_path)})
    assert listed.returncode == 0 and "local" in listed.stdout, listed.stderr


@pytest.fixture
def empty_database(make_database: Callable[[], str]) -> str:
    """A configured database that has never been migrated."""
    return make_database()


def test_a_configured_database_behind_the_schema_says_what_to_run(empty_database: str):
    done = rlgw(
        "keys", "create", "--tenant", "t", "--quiet", env={"RLGW_DATABASE_URL": empty_database}
    )
    assert_one_line_failure(done, 2, "rlgw db upgrade")
    with psycopg.connect(to_libpq_uri(empty_database)) as conn:  # nothing was created
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()[0]
    assert tables == 0


def test_commands_report_an_unreachable_database_in_one_line():
    dead = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    for argv in (("keys", "list"), ("export", "--session", "s"), ("train", "--model", "m")):
        assert_one_line_failure(
            rlgw(*argv, env={"RLGW_DATABASE_URL": dead}), 1, "cannot reach the database"
        )


def test_train_with_an_unknown_model_is_a_usage_error(database_url: str):
    done = rlgw("train", "--model", "no-such-model", env={"RLGW_DATABASE_URL": database_url})
    assert_one_line_failure(done, 2, "no model named 'no-such-model'")


def test_up_with_a_model_directory_that_cannot_be_served_starts_nothing(tmp_path: Path):
    home = tmp_path / "home"
    missing = rlgw("up", "--model", str(tmp_path / "nowhere"), env={"RLGW_HOME": str(home)})
    assert_one_line_failure(missing, 2, "no model directory")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text('{"architectures": ["NoSuchModelForCausalLM"]}')
    (odd / "model.safetensors").write_bytes(b"")
    (odd / "tokenizer.json").write_text("{}")
    refused = rlgw("up", "--model", str(odd), env={"RLGW_HOME": str(home)})
    assert_one_line_failure(refused, 2, "NoSuchModelForCausalLM", "cannot serve")
    assert not (home / "pgdata").exists()  # refused before the database started


def test_a_named_tool_parser_the_checkpoint_cannot_support_is_refused_before_vllm_starts(
    tiny_model_dir: Path, tmp_path: Path
):
    """The tiny model's template writes <tool_call> (hermes); its tokenizer has no
    <|python_tag|>, which vLLM's llama3_json parser looks up at start."""
    done = rlgw(
        "backend", "--model", str(tiny_model_dir), "--port", str(free_port()),
        "--tool-call-parser", "llama3_json", env={"RLGW_HOME": str(tmp_path)},
    )  # fmt: skip
    assert_one_line_failure(done, 2, "--tool-call-parser llama3_json cannot work", "python_tag")
    assert not (tmp_path / "logs").exists()  # vLLM never started


def test_a_vllm_that_fails_to_start_is_one_line_naming_its_log(
    tiny_model_dir: Path, make_database: Callable[[], str], tmp_path: Path
):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    home = tmp_path / "home"
    port = free_port()
    env = {"RLGW_HOME": str(home), "RLGW_DATABASE_URL": make_database()}
    done = rlgw("up", "--model", str(broken), "--backend-port", str(port), env=env)
    log = home / "logs" / f"vllm-{port}.log"
    assert_one_line_failure(done, 1, "vLLM exited with code", f"(log: {log})")
    assert log.is_file() and "Traceback" in log.read_text()  # the details stay in the log
