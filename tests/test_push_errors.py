"""Expected failures of `rlgw push` are typed errors with a one-line message, and none of them
leaves the versions where the next push cannot continue (real Postgres; no backend needed)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from sqlalchemy import text

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.registry import store_model
from rlgw.settings import Settings
from trainer.errors import (
    BadUpdate,
    DatabaseUnavailable,
    PushRefused,
    TrainerError,
    UnknownModel,
    VersionConflict,
    VersionFilesUnavailable,
)
from trainer.publishing.publish import Publisher
from trainer.publishing.push import push
from trainer.weight_update.files import DeltaFile

from conftest import MODEL_NAME, free_port, gateway_settings
from swap_helpers import random_delta, write_delta


@dataclass
class Registry:
    db_url: str
    settings: Settings
    model_dir: Path

    def versions(self) -> tuple[int, int]:
        """(newest policy_versions row, models.current_version)."""
        engine = make_sync_engine(self.db_url)
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT max(v.version), m.current_version FROM models m "
                    "JOIN policy_versions v ON v.model_id = m.id WHERE m.name = :n "
                    "GROUP BY m.current_version"
                ),
                {"n": MODEL_NAME},
            ).one()
        engine.dispose()
        return tuple(row)


@pytest.fixture(scope="module")
def registry(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Registry]:
    """A model registered without any backend."""
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    with sync_session_factory(engine)() as db, db.begin():
        store_model(db, MODEL_NAME, [], model_path=str(tiny_model_dir), replace=False)
    engine.dispose()
    settings = gateway_settings(db_url).model_copy(
        update={"home": tmp_path_factory.mktemp("push-home")}
    )
    yield Registry(db_url, settings, tiny_model_dir)


def one_line(error: TrainerError) -> str:
    message = str(error)
    assert message and "\n" not in message
    return message


def test_a_push_without_a_backend_is_recorded_current_and_says_no_backend_took_it(
    registry, tmp_path
):
    before, _ = registry.versions()
    path = write_delta(random_delta(registry.model_dir, 1), tmp_path / "d.safetensors")
    with pytest.raises(PushRefused) as refused:
        push(registry.settings, registry.db_url, MODEL_NAME, delta=path)
    assert "has no backend registered" in one_line(refused.value)
    assert refused.value.version == before + 1
    assert registry.versions() == (before + 1, before + 1)


def test_a_push_to_an_unknown_model_is_refused(registry, tmp_path):
    path = write_delta(random_delta(registry.model_dir, 1), tmp_path / "d.safetensors")
    with pytest.raises(UnknownModel) as unknown:
        push(registry.settings, registry.db_url, "no-such-model", delta=path)
    assert "no-such-model" in one_line(unknown.value)


@pytest.mark.parametrize("problem", ["missing", "not-safetensors", "wrong-shape", "nan"])
def test_a_bad_file_is_refused_before_a_version_is_recorded(registry, tmp_path, problem):
    before = registry.versions()
    delta = random_delta(registry.model_dir, 2)
    path = tmp_path / "d.safetensors"
    if problem == "not-safetensors":
        path.write_text("not a safetensors file")
    elif problem == "wrong-shape":
        delta["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    elif problem == "nan":
        delta["model.norm.weight"] = torch.full_like(delta["model.norm.weight"], float("nan"))
    if problem in ("wrong-shape", "nan"):
        write_delta(delta, path)
    with pytest.raises(BadUpdate) as bad:
        push(registry.settings, registry.db_url, MODEL_NAME, delta=path)
    one_line(bad.value)
    assert registry.versions() == before


def test_a_push_without_the_database_says_so(registry, tmp_path):
    path = write_delta(random_delta(registry.model_dir, 3), tmp_path / "d.safetensors")
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/rlgw"  # nothing listens
    with pytest.raises(DatabaseUnavailable) as down:
        push(registry.settings, nowhere, MODEL_NAME, delta=path)
    assert "database is unavailable" in one_line(down.value)


def test_a_version_published_meanwhile_is_a_conflict_and_records_nothing(registry):
    latest, _ = registry.versions()
    engine = make_sync_engine(registry.db_url)
    with (
        Publisher(registry.settings, engine, MODEL_NAME) as publisher,
        pytest.raises(VersionConflict) as conflict,  # built on an older version
    ):
        publisher.record(latest - 1, random_delta(registry.model_dir, 4), DeltaFile)
    engine.dispose()
    assert f"at version {latest}" in one_line(conflict.value)
    assert registry.versions() == (latest, latest)


def test_a_registry_wedged_by_an_older_push_continues_from_its_newest_version(registry, tmp_path):
    """Before the publisher, a push that no backend took kept its version row but left
    current_version behind, and every later push hit the unique (model, version) constraint."""
    engine = make_sync_engine(registry.db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE models SET current_version = current_version - 1"))
    engine.dispose()
    newest, current = registry.versions()
    assert current == newest - 1
    path = write_delta(random_delta(registry.model_dir, 5), tmp_path / "d.safetensors")
    with pytest.raises(PushRefused):  # no backend here; recorded all the same
        push(registry.settings, registry.db_url, MODEL_NAME, delta=path)
    assert registry.versions() == (newest + 1, newest + 1)


def test_a_version_file_bind_that_cannot_be_served_is_one_line_and_records_nothing(
    registry, tmp_path
):
    before = registry.versions()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        settings = registry.settings.model_copy(update={"version_files_bind": bind})
        delta = write_delta(random_delta(registry.model_dir, 7), tmp_path / "d.safetensors")
        with pytest.raises(VersionFilesUnavailable) as caught:
            push(settings, registry.db_url, MODEL_NAME, delta=delta)
    assert f"RLGW_VERSION_FILES_BIND={bind}" in one_line(caught.value)
    assert registry.versions() == before
