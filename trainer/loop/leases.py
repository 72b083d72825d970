"""Claim leases: the heartbeat that renews this trainer's, and the commit-time check that it
still holds every session it trained on.

A claim lasts `RLGW_CLAIM_LEASE_S` seconds unless renewed; rank 0 renews the leases it holds
every quarter of that, from a thread, so a slow update keeps its claims while a stopped, frozen
or cut-off trainer loses them and another trainer takes the sessions (trainer/loop/claims.py).
A trainer commits only what it still holds: the transaction that records a version first locks
its sessions and checks them, and records nothing if any was lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession

from .claims import held, lease_from_now


class ClaimLost(Exception):
    """Some sessions of this update are no longer held by this trainer (their lease passed)."""

    def __init__(self, lost: list[str]) -> None:
        super().__init__(f"{len(lost)} claimed session(s) lost: {', '.join(sorted(lost)[:3])}")
        self.lost = lost


def renew_leases(engine: Engine, instance_id: int, lease_s: float) -> int:
    """Extend every live lease this instance holds to `lease_s` from now; a lease already passed
    stays lost. Rows locked meanwhile (being committed or released) are skipped: they are
    renewed at the next beat."""
    locked = (
        select(AgentSession.id)
        .where(held(instance_id))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    # One autocommit statement: the server commits it as soon as it has run, so a trainer
    # stopped in the middle of a beat never leaves the rows locked (others would skip them and
    # could not release them).
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return conn.execute(
            update(AgentSession)
            .where(AgentSession.id.in_(locked))
            .values(lease_expires_at=lease_from_now(lease_s))
        ).rowcount


def check_held(db: Session, session_ids: list[str], instance_id: int) -> None:
    """In the committing transaction: lock the sessions (in id order, as every locker here does)
    and raise ClaimLost unless this instance still holds every one with a live lease."""
    rows = db.scalars(
        select(AgentSession.id)
        .where(AgentSession.id.in_(session_ids))
        .order_by(AgentSession.id)
        .with_for_update()
    ).all()
    still = set(
        db.scalars(
            select(AgentSession.id).where(AgentSession.id.in_(rows), held(instance_id))
        ).all()
    )
    lost = [sid for sid in session_ids if sid not in still]
    if lost:
        raise ClaimLost(lost)


class Heartbeat:
    """A daemon thread that renews this instance's leases every `lease_s / 4` seconds until
    stopped. A failed renewal (the database away for a moment) is logged and retried at the next
    beat: three beats may fail before a lease passes."""

    def __init__(
        self, engine: Engine, instance_id: int, lease_s: float, log: Callable[[str], None] = print
    ) -> None:
        self._engine, self._instance_id, self._lease_s, self._log = (
            engine,
            instance_id,
            lease_s,
            log,
        )
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlgw-claim-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._lease_s / 4):
            try:
                renew_leases(self._engine, self._instance_id, self._lease_s)
            except Exception as exc:  # noqa: BLE001 - a beat must never kill the thread
                self._log(f"[train] could not renew the claim leases (retrying): {exc}")

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
