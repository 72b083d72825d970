"""Registering a vLLM backend: check it answers as the model, learn its version, store it."""

from __future__ import annotations

import httpx
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from rlgw.db.models import Backend, PolicyVersion, RegisteredModel

BASE_VERSION = 0
# vLLM reports this label until someone sets one: the weights it was launched with.
UNSET_VERSION_LABEL = "default"


class RegistrationError(RuntimeError):
    """The target is not a usable backend of the named model."""


def version_label(version: int) -> str:
    """The weight-version label stored inside vLLM for a policy version."""
    return str(version)


def read_backend_version(http: httpx.Client, url: str) -> str:
    reply = http.get(f"{url}/weight_info")
    reply.raise_for_status()
    return str(reply.json().get("weight_version"))


def _resolve_version(http: httpx.Client, url: str) -> int:
    label = read_backend_version(http, url)
    if label == UNSET_VERSION_LABEL:
        # A server that was never swapped serves the checkpoint it was launched with: the base.
        http.post(
            f"{url}/update_weight_version", json={"new_version": version_label(BASE_VERSION)}
        ).raise_for_status()
        return BASE_VERSION
    try:
        return int(label)
    except ValueError:
        raise RegistrationError(f"{url} serves weight version {label!r}, unknown to rlgw") from None


def _check_serves(http: httpx.Client, url: str, model: str) -> None:
    reply = http.get(f"{url}/v1/models")
    reply.raise_for_status()
    served = [m.get("id") for m in reply.json().get("data", [])]
    if model not in served:
        raise RegistrationError(f"{url} serves {served}, not {model!r}")


def register_backend(
    sessions: sessionmaker[Session],
    model: str,
    url: str,
    *,
    model_path: str | None = None,
    timeout_s: float = 5.0,
) -> int:
    """Register `url` as an ACTIVE backend of `model` (creating the model); return its id."""
    url = url.rstrip("/")
    with httpx.Client(timeout=timeout_s, follow_redirects=False) as http:
        try:
            _check_serves(http, url, model)
            version = _resolve_version(http, url)
        except httpx.HTTPError as exc:
            raise RegistrationError(f"{url} does not answer as a vLLM server: {exc}") from exc
    with sessions() as db, db.begin():
        db.execute(
            insert(RegisteredModel)
            .values(name=model, path=model_path)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        model_id = db.execute(
            select(RegisteredModel.id).where(RegisteredModel.name == model)
        ).scalar_one()
        db.execute(
            insert(PolicyVersion)
            .values(model_id=model_id, version=BASE_VERSION, kind="base", weights_path=model_path)
            .on_conflict_do_nothing()
        )
        values = {
            "model_id": model_id,
            "url": url,
            "state": "active",
            "state_reason": None,
            "served_version": version,
        }
        return db.execute(
            insert(Backend)
            .values(**values)
            .on_conflict_do_update(index_elements=["url"], set_=values)
            .returning(Backend.id)
        ).scalar_one()
