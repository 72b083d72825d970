"""The gateway's view of the backend registry, and least-in-flight routing over ACTIVE, reachable
backends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from rlgw.adapters import served_name
from rlgw.db.models import Backend, RegisteredModel
from rlgw.eligibility import CROSSED_SWAP, NOT_FOLLOWING

from ..errors import APIError
from .canary import VersionRules, read_rules

log = logging.getLogger("rlgw.routing")

ACTIVE = "active"
RETRY_AFTER_S = 5
HEARD_KEPT = 32  # registry changes kept per backend in this process's log


@dataclass(frozen=True)
class Heard:
    """A registry change as this process learnt it: the state it read, and when (wall clock).
    The propagation delay of a change is `at` minus the registry row's `updated_at`."""

    state: str
    served_version: int | None
    swap_epoch: int
    at: float


@dataclass
class BackendView:
    """One backend as this gateway process sees it. `in_flight` and the health fields are this
    process's own (not in Postgres): `unreachable_reason` is None while the backend answers."""

    id: int
    model: str
    url: str
    state: str
    served_version: int | None
    swap_epoch: int
    lora: bool = False  # the model is trained with LoRA: its versions are adapters
    in_flight: int = 0
    unreachable_reason: str | None = None
    heard: deque[Heard] = field(default_factory=lambda: deque(maxlen=HEARD_KEPT))

    def hear(self, state: str, served_version: int | None, swap_epoch: int) -> None:
        """Take the registry's state; log it when routing-relevant facts changed."""
        changed = (state, served_version, swap_epoch) != (
            self.state,
            self.served_version,
            self.swap_epoch,
        )
        self.state, self.served_version, self.swap_epoch = state, served_version, swap_epoch
        if changed or not self.heard:
            self.heard.append(Heard(state, served_version, swap_epoch, time.time()))

    @property
    def served_name(self) -> str:
        """The model name its version is served under (a LoRA version: its adapter)."""
        return served_name(self.model, self.served_version, lora=self.lora)

    @property
    def in_service(self) -> bool:
        """In service by the registry (the swap protocol's state), reachable or not."""
        return self.state == ACTIVE and self.served_version is not None

    @property
    def reachable(self) -> bool:
        return self.unreachable_reason is None

    @property
    def routable(self) -> bool:
        return self.in_service and self.reachable


@dataclass(frozen=True)
class Lease:
    """A backend chosen for one request, and the policy version it serves for the request's life
    (under `served_name`: the model's name, or the adapter of its version)."""

    backend_id: int
    url: str
    served_version: int
    swap_epoch: int
    served_name: str


@dataclass
class BackendPool:
    """Routes requests to ACTIVE backends; re-reads the registry from Postgres on `refresh()`."""

    db_sessions: async_sessionmaker
    hold_timeout_s: float = 30.0
    # Whether the registry listener is connected now. Epochs are exact while it is (NOTIFY), and
    # again once it has reconnected (it re-reads the registry before saying so): every pause
    # bumps its backend's epoch, so an unchanged epoch means no swap happened in between.
    following: bool = False
    _by_id: dict[int, BackendView] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    # Which versions may serve which sessions (promotion gates, canaries): gateway/proxy/canary.py
    versions: VersionRules = field(default_factory=VersionRules)

    async def refresh(self) -> None:
        async with self.db_sessions() as db:
            rows = (
                await db.execute(
                    select(Backend, RegisteredModel.name, RegisteredModel.lora).join(
                        RegisteredModel, Backend.model_id == RegisteredModel.id
                    )
                )
            ).all()
            versions = await read_rules(db)
        self.versions = versions
        seen = set()
        for backend, model_name, lora in rows:
            seen.add(backend.id)
            view = self._by_id.get(backend.id)
            if view is None:
                view = self._by_id[backend.id] = BackendView(
                    backend.id,
                    model_name,
                    backend.url,
                    backend.state,
                    backend.served_version,
                    backend.swap_epoch,
                )
            else:  # keep the in-flight count and health: they are this process's own
                if view.url != backend.url:  # another server now: its health is unknown
                    view.unreachable_reason = None
                view.model, view.url = model_name, backend.url
            view.lora = lora is not None
            view.hear(backend.state, backend.served_version, backend.swap_epoch)
        for gone in set(self._by_id) - seen:
            del self._by_id[gone]
        async with self._changed:
            self._changed.notify_all()

    def models(self) -> list[str]:
        return sorted({b.model for b in self._by_id.values()})

    def backends(self) -> list[BackendView]:
        return sorted(self._by_id.values(), key=lambda b: b.id)

    async def mark(self, backend_id: int, unreachable_reason: str | None) -> None:
        """Record whether this process can reach a backend (None: it can); a backend that comes
        back wakes the requests waiting for one."""
        view = self._by_id.get(backend_id)
        if view is None or view.unreachable_reason == unreachable_reason:
            return
        if unreachable_reason is None:
            log.info("backend %s (%s) is reachable again", view.id, view.url)
        elif view.reachable:
            log.warning("backend %s (%s) is unreachable: %s", view.id, view.url, unreachable_reason)
        view.unreachable_reason = unreachable_reason
        async with self._changed:
            self._changed.notify_all()

    def _pick(
        self, model: str, exclude: Collection[int], pin: int | None = None
    ) -> BackendView | None:
        candidates = [
            b
            for b in self._by_id.values()
            if b.model == model
            and b.routable
            and b.id not in exclude
            and self.versions.admits(model, b.served_version, pin)
        ]
        return min(candidates, key=lambda b: (b.in_flight, b.id), default=None)

    @contextlib.asynccontextmanager
    async def lease(
        self, model: str, exclude: Collection[int] = (), pin: int | None = None
    ) -> AsyncIterator[Lease]:
        """Hold one ACTIVE, reachable backend of `model` (not one of `exclude`) for a request;
        with `pin` (the session's pinned version) one serving exactly that version, without one
        a backend whose version is promoted (gateway/proxy/canary.py).

        When every backend of the model is out of routing (a swap in progress), the request waits
        up to `hold_timeout_s` rather than being sent to a paused server, where vLLM would queue it
        and later run it on new weights under the old version label. When backends are in service
        but none can be used (unreachable from here, or in `exclude`), waiting would not help: the
        request fails at once with 503 `backend_unavailable`.
        """
        if not any(b.model == model for b in self._by_id.values()):
            raise APIError(
                404, f"The model `{model}` does not exist.", code="model_not_found", param="model"
            )
        view = self._pick(model, exclude, pin)
        if view is None:
            view = await self._wait_for_backend(model, exclude, pin)
        view.in_flight += 1
        try:
            assert view.served_version is not None
            yield Lease(view.id, view.url, view.served_version, view.swap_epoch, view.served_name)
        finally:
            view.in_flight -= 1

    async def _wait_for_backend(
        self, model: str, exclude: Collection[int], pin: int | None = None
    ) -> BackendView:
        def admitted(b: BackendView) -> bool:
            return b.model == model and self.versions.admits(model, b.served_version, pin)

        async def _ready() -> BackendView:
            async with self._changed:
                while (view := self._pick(model, exclude, pin)) is None:
                    if any(admitted(b) and b.in_service for b in self._by_id.values()):
                        raise _unavailable(f"no backend of `{model}` can be reached; retry later")
                    await self._changed.wait()
                return view

        try:
            return await asyncio.wait_for(_ready(), self.hold_timeout_s)
        except TimeoutError:
            raise _unavailable(
                f"no backend of `{model}` is in service (weight swap or outage); retry later"
            ) from None

    def follow(self, connected: bool) -> None:
        """The registry listener (re)connected (after re-reading the registry), or lost it."""
        self.following = connected

    def swap_doubt(self, lease: Lease) -> str | None:
        """Why the tokens of a request on `lease`, finishing now, may not all come from its
        stamped version: its backend entered a swap (was paused) since the lease began, or this
        process cannot tell, its registry listener being disconnected now. None when neither."""
        view = self._by_id.get(lease.backend_id)
        if view is None or view.swap_epoch != lease.swap_epoch:
            return CROSSED_SWAP
        return None if self.following else NOT_FOLLOWING


def _unavailable(message: str) -> APIError:
    return APIError(
        503, message, code="backend_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)}
    )
