"""The doubtful-commit journal: what one process writes, a later process adopts, once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.recording.doubtful_journal import DoubtfulJournal, journal_directory


def test_the_directory_depends_on_the_database_not_on_the_password(tmp_path: Path) -> None:
    a = journal_directory(tmp_path, "postgresql+psycopg://u:one@db:5432/rl")
    assert a == journal_directory(tmp_path, "postgresql+psycopg://u:two@db:5432/rl")
    assert a != journal_directory(tmp_path, "postgresql+psycopg://u:one@db:5432/other")
    assert a.parent == tmp_path / "doubtful"


def test_write_replaces_and_an_empty_journal_is_removed(tmp_path: Path) -> None:
    journal = DoubtfulJournal(tmp_path)
    journal.write({"c1": "s1", "c2": "s2"})
    journal.write({"c2": "s2"})
    assert journal.path.read_text().count("\n") == 1 and '"c2"' in journal.path.read_text()
    journal.write({})
    assert not journal.path.exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_adopts_stopped_processes_and_own_pid_but_not_running_ones(tmp_path: Path) -> None:
    (tmp_path / f"{_dead_pid()}.jsonl").write_text('{"id": "dead", "session_id": "s"}\n')
    (tmp_path / f"{os.getppid()}.jsonl").write_text('{"id": "alive", "session_id": "s"}\n')
    (tmp_path / f"{os.getpid()}.jsonl").write_text('{"id": "mine-before", "session_id": "s"}\n')
    (tmp_path / "notes.jsonl").write_text("not a pid\n")
    journal = DoubtfulJournal(tmp_path)
    assert journal.adopt() == {"dead": "s", "mine-before": "s"}


def test_a_torn_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    (tmp_path / f"{_dead_pid()}.jsonl").write_text(
        '{"id": "kept", "session_id": "s"}\n{"id": "torn", "sess'
    )
    assert DoubtfulJournal(tmp_path).adopt() == {"kept": "s"}


def test_settled_drops_adopted_files_and_keeps_what_is_pending(tmp_path: Path) -> None:
    left = tmp_path / f"{_dead_pid()}.jsonl"
    left.write_text('{"id": "old", "session_id": "s"}\n')
    journal = DoubtfulJournal(tmp_path)
    journal.adopt()
    journal.settled({"new": "s"})
    assert not left.exists()
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == [journal.path.name]
    journal.settled({})
    assert not list(tmp_path.glob("*.jsonl"))
