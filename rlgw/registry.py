"""Registering vLLM backends: check the URL is allowed, check it answers as the model, learn its
version, store it.

The network rules are in `rlgw.netguard`: every request of a registration goes to the address
resolved once when the URL was checked, never follows a redirect, ignores proxy settings from the
environment and reads at most `MAX_PROBE_BYTES` of each answer. The same code serves
`POST /register_model`, `rlgw register` and `rlgw up`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from rlgw import backend_state
from rlgw.db.models import Backend, PolicyVersion, RegisteredModel
from rlgw.netguard import Allowlist, PinnedTarget, TargetRefused, check_backend_url, parse_allowlist
from rlgw.settings import DEFAULT_BACKEND_ALLOWLIST

BASE_VERSION = 0
# vLLM reports this label until someone sets one: the weights it was launched with.
UNSET_VERSION_LABEL = "default"
MAX_PROBE_BYTES = 1 << 20
PROBE_TIMEOUT_S = 5.0
PROBE_CONNECT_TIMEOUT_S = 3.0


class RegistrationError(RuntimeError):
    """The target is not a usable backend of the named model."""


class TargetNotAllowed(RegistrationError):
    """The URL breaks a network rule (rlgw.netguard); nothing was sent to it."""


class RegistrationConflict(RegistrationError):
    """The model or a backend URL is already registered, and replacing was not asked for."""


def version_label(version: int) -> str:
    """The weight-version label stored inside vLLM for a policy version."""
    return str(version)


def read_backend_version(http: httpx.Client, url: str) -> str:
    reply = http.get(f"{url}/weight_info")
    reply.raise_for_status()
    return str(reply.json().get("weight_version"))


def resolve_allowlist(allowlist: Allowlist | str | None) -> Allowlist:
    if isinstance(allowlist, Allowlist):
        return allowlist
    return parse_allowlist(DEFAULT_BACKEND_ALLOWLIST if allowlist is None else allowlist)


def check_target(url: str, allowlist: Allowlist | str | None, *, trust_target: bool = False):
    """The pinned target of `url`, or TargetNotAllowed. `trust_target` skips the allowlist only
    (an operator's explicit choice); the other rules still apply."""
    try:
        return check_backend_url(url, None if trust_target else resolve_allowlist(allowlist))
    except TargetRefused as exc:
        raise TargetNotAllowed(str(exc)) from None


class _Probe:
    """HTTP to one pinned target: no redirects, no proxies, bounded answers."""

    def __init__(self, target: PinnedTarget, http: httpx.Client) -> None:
        self.target, self.http = target, http

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        t = self.target
        request = self.http.build_request(
            method,
            t.request_url(path),
            headers={"Host": t.host_header},
            extensions=t.extensions,
            **kwargs,
        )
        reply = self.http.send(request, stream=True)
        try:
            if reply.is_redirect:
                raise RegistrationError(
                    f"{t.url}{path} answered {reply.status_code} (redirects are not followed)"
                )
            if reply.status_code != 200:
                raise RegistrationError(f"{t.url}{path} answered HTTP {reply.status_code}")
            body = b""
            for chunk in reply.iter_bytes():
                body += chunk
                if len(body) > MAX_PROBE_BYTES:
                    raise RegistrationError(f"{t.url}{path} answered more than {MAX_PROBE_BYTES}")
        finally:
            reply.close()
        try:
            return httpx.Response(200, content=body).json() if body else None
        except ValueError:
            raise RegistrationError(f"{t.url}{path} did not answer JSON") from None


def probe_backend(
    target: PinnedTarget,
    model: str,
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Check the target answers as a vLLM server of `model`; return the version it serves
    (labelling a never-swapped server as the base version)."""
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, PROBE_CONNECT_TIMEOUT_S))
    with httpx.Client(
        timeout=timeout, follow_redirects=False, trust_env=False, transport=transport
    ) as http:
        probe = _Probe(target, http)
        try:
            models = probe.call("GET", "/v1/models")
            data = models.get("data") if isinstance(models, dict) else None
            served = (
                [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
            )
            if model not in served:
                raise RegistrationError(f"{target.url} serves {served[:10]}, not {model!r}")
            info = probe.call("GET", "/weight_info")
            label = str(info.get("weight_version")) if isinstance(info, dict) else None
            if label == UNSET_VERSION_LABEL:
                # A server that was never swapped serves the checkpoint it was launched with.
                probe.call(
                    "POST",
                    "/update_weight_version",
                    json={"new_version": version_label(BASE_VERSION)},
                )
                return BASE_VERSION
            try:
                return int(label)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise RegistrationError(
                    f"{target.url} serves weight version {label!r}, unknown to rlgw"
                ) from None
        except httpx.HTTPError as exc:
            raise RegistrationError(
                f"{target.url} does not answer as a vLLM server: {type(exc).__name__}"
            ) from exc


# ----------------------------------------------------------------------------- storage


@dataclass
class StoredBackend:
    id: int
    url: str
    served_version: int
    state: str


def _upsert_model(db: Session, model: str, model_path: str | None) -> int:
    db.execute(
        insert(RegisteredModel)
        .values(name=model, path=model_path)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    row = db.execute(
        select(RegisteredModel).where(RegisteredModel.name == model).with_for_update()
    ).scalar_one()
    if model_path is not None:
        row.path = model_path
    db.execute(
        insert(PolicyVersion)
        .values(model_id=row.id, version=BASE_VERSION, kind="base", weights_path=model_path)
        .on_conflict_do_nothing()
    )
    return row.id


def _store_backend(db: Session, model_id: int, url: str, version: int) -> int:
    owner = db.execute(select(Backend.model_id).where(Backend.url == url)).scalar_one_or_none()
    if owner is not None and owner != model_id:
        raise RegistrationConflict(f"{url} is already registered to another model")
    values = {
        "model_id": model_id,
        "url": url,
        "state": backend_state.ACTIVE,
        "state_reason": None,
        "served_version": version,
    }
    backend_id = db.execute(
        insert(Backend)
        .values(**values)
        .on_conflict_do_update(index_elements=["url"], set_=values)
        .returning(Backend.id)
    ).scalar_one()
    db.execute(backend_state.NOTIFY, backend_state.notify_args(backend_id))
    return backend_id


def model_exists(db: Session, model: str) -> bool:
    return (
        db.execute(select(RegisteredModel.id).where(RegisteredModel.name == model)).first()
        is not None
    )


def store_model(
    db: Session,
    model: str,
    probed: Sequence[tuple[str, int]],
    *,
    model_path: str | None,
    replace: bool,
) -> list[StoredBackend]:
    """Store a model and its probed backends (url, version) in the caller's transaction.

    Without `replace` an existing model is a conflict. With it, the listed backends become the
    model's routed set; its other backends are drained (in-flight requests finish, nothing new is
    routed to them; an admin may resume them)."""
    if model_exists(db, model) and not replace:
        raise RegistrationConflict(
            f"model {model!r} is already registered: send replace=true to re-register it"
        )
    model_id = _upsert_model(db, model, model_path)
    ids = [_store_backend(db, model_id, url, version) for url, version in probed]
    others = db.execute(
        select(Backend.id).where(
            Backend.model_id == model_id,
            Backend.id.not_in(ids),
            Backend.state == backend_state.ACTIVE,
        )
    ).scalars()
    for other in list(others):
        db.execute(
            backend_state.set_state(
                other, backend_state.DRAINING, "not listed when the model was re-registered"
            )
        )
        db.execute(backend_state.NOTIFY, backend_state.notify_args(other))
    return [
        StoredBackend(id=i, url=url, served_version=v, state=backend_state.ACTIVE)
        for i, (url, v) in zip(ids, probed, strict=True)
    ]


def register_backend(
    db_sessions: sessionmaker[Session],
    model: str,
    url: str,
    *,
    model_path: str | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
    allowlist: Allowlist | str | None = None,
    trust_target: bool = False,
) -> int:
    """Register `url` as an ACTIVE backend of `model` (creating the model); return its id.

    Registering the same URL for the same model again re-checks it and is harmless; a URL of
    another model is a conflict. `allowlist` defaults to loopback only (RLGW_BACKEND_ALLOWLIST's
    default); `trust_target=True` skips it, explicitly."""
    target = check_target(url, allowlist, trust_target=trust_target)
    version = probe_backend(target, model, timeout_s=timeout_s)
    with db_sessions() as db, db.begin():
        model_id = _upsert_model(db, model, model_path)
        return _store_backend(db, model_id, target.url, version)
