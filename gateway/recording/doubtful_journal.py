"""A file journal of completions whose commit outcome is unknown, so a restart still marks them.

The recorder gives up on a record whose last COMMIT may have landed although its caller was told
the call failed; such a row must be made ineligible once the database answers. If the gateway
stops first, this journal carries the ids to the next start: each process keeps its own file,
`<directory>/<pid>.jsonl` (one `{"id", "session_id"}` object per line, replaced atomically), and a
starting process adopts the files of processes that are no longer running. The directory is per
database (see `journal_directory`), so ids are never applied to another database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from sqlalchemy.engine import make_url

log = logging.getLogger("rlgw.recording")


def journal_directory(home: Path, database_url: str) -> Path:
    """`<home>/doubtful/<digest of the database's host, port and name>`."""
    url = make_url(database_url)
    identity = f"{url.host or ''}:{url.port or ''}/{url.database or ''}"
    return home / "doubtful" / hashlib.sha256(identity.encode()).hexdigest()[:16]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class DoubtfulJournal:
    """This process's journal file, and the files that stopped processes left behind."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"{os.getpid()}.jsonl"
        self._adopted: list[Path] = []

    def adopt(self) -> dict[str, str]:
        """The entries (completion id -> session id) of the journals of processes not running.
        A file named with this process's own pid is a previous life's (a container restarted
        with the same pid), so it is adopted too."""
        entries: dict[str, str] = {}
        if not self.directory.is_dir():
            return entries
        for path in sorted(self.directory.glob("*.jsonl")):
            try:
                pid = int(path.stem)
            except ValueError:
                continue
            if pid != os.getpid() and _running(pid):
                continue
            entries.update(_read(path))
            self._adopted.append(path)
        if entries:
            log.warning(
                "adopted %d completion(s) of unknown commit outcome from %s: they will be "
                "marked ineligible once the database answers",
                len(entries),
                ", ".join(p.name for p in self._adopted),
            )
        return entries

    def write(self, pending: dict[str, str]) -> None:
        """Make this process's journal hold exactly `pending` (removed when empty), durably."""
        if not pending:
            self.path.unlink(missing_ok=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        with partial.open("w") as out:
            for completion_id, session_id in sorted(pending.items()):
                out.write(json.dumps({"id": completion_id, "session_id": session_id}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)

    def settled(self, pending: dict[str, str]) -> None:
        """Everything adopted was marked: drop the adopted files, keep what is still `pending`."""
        for path in self._adopted:
            if path != self.path:
                path.unlink(missing_ok=True)
        self._adopted.clear()
        self.write(pending)


def _read(path: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            entries[str(entry["id"])] = str(entry["session_id"])
        except (ValueError, KeyError, TypeError):
            log.error("%s line %d is not a journal entry; skipped: %r", path, number, line[:200])
    return entries
