"""The README runs as written: its shell and Python blocks, in order, against a live `rlgw up` on a
fresh state directory (embedded Postgres, the tiny model, a real vLLM CPU backend, the trainer).

What the test changes in the text: the gateway's port (`127.0.0.1:8000` becomes a free port, so
the suite never collides with a gateway already running on this machine). Blocks preceded by a
`<!-- readme-test: skip (why) -->` line are not run, and must say why (the two set-up commands:
the test itself is the second, and it starts the first's stack on its own; blocks that need the
reader's own checkpoint or a GPU host)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.processes import start_server, stop_group
from rlgw.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((?P<why>[^)]+)\)")
FENCE = re.compile(r"^```(\w+)\s*$")


@dataclass
class Block:
    language: str
    code: str
    line: int  # 1-based line of the opening fence
    skipped: bool


def readme_blocks(text: str) -> list[Block]:
    """Every fenced bash or python block, with whether a skip marker precedes it."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence and fence.group(1) in ("bash", "python"):
            start, body = i, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            blocks.append(
                Block(fence.group(1), "\n".join(body), start + 1, bool(SKIP.search(before)))
            )
        i += 1
    return blocks


def test_every_readme_block_is_run_or_says_why_not() -> None:
    blocks = readme_blocks(README.read_text())
    assert [b for b in blocks if not b.skipped], "the README has no runnable block"
    runnable = [b for b in blocks if not b.skipped]
    assert any("rlgw keys create" in b.code for b in runnable)  # the quick start is run
    assert any("/trajectory" in b.code for b in runnable)  # and the sessions walk-through


@dataclass
class Stack:
    port: int
    env: dict[str, str]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`rlgw up` as a new user starts it: nothing configured but a state directory."""
    home = tmp_path_factory.mktemp("readme-home")
    port, backend_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGW_")}
    env.update(RLGW_HOME=str(home), PATH=f"{VENV_BIN}:{env.get('PATH', '')}")
    proc = start_server(
        [str(VENV_BIN / "rlgw"), "up", "--port", str(port), "--backend-port", str(backend_port)],
        env=env,
        log_path=home / "rlgw-up.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
        name="rlgw up",
        timeout_s=600,
    )
    try:
        yield Stack(port, env)
    finally:
        stop_group(proc, timeout_s=60)


def test_the_readme_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    blocks = [b for b in readme_blocks(README.read_text()) if not b.skipped]
    script = ["set -euo pipefail", f"cd {ROOT}"]
    for n, block in enumerate(blocks):
        code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{stack.port}")
        script.append(f"echo '@@block {n} (README line {block.line})'")
        if block.language == "python":
            path = tmp_path / f"block{n}.py"
            path.write_text(code)
            script.append(f"python {path}")
        else:
            script.append(code)
        script.append("echo")  # curl -s prints no newline after a JSON body
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    outputs = re.split(r"^@@block \d+ .*$", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks)
    checked = 0
    for block, out in zip(blocks, outputs, strict=True):
        for expected in expected_output(block):
            assert expected in out, f"README line {block.line} printed\n{out}\nwithout {expected!r}"
            checked += 1
    assert checked >= 6  # the quick start, the session walk-through and the Python client
    assert "Traceback" not in done.stderr, done.stderr[-4000:]


def expected_output(block: Block) -> list[str]:
    """What a block must print, by what it does (a curl that fails prints an error envelope)."""
    code, expected = block.code, []
    if block.language == "python" and "chat.completions.create" in code:
        return ["chatcmpl-"]  # it prints the reply's id: the gateway's record id
    if "/chat/completions" in code:
        expected.append('"chat.completion"')
    if "/rewards" in code:
        expected += ['"counts":true', '"value":1.0']
    if "/trajectory" in code:
        expected += ['"steps":[', '"output_token_ids":[', '"reward_normalized"']
    return expected
