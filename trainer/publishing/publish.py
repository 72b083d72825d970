"""Publishing policy versions, the one path shared by the trainer and `rlgw push`: reserve the next
version, write its payload, record it as current, then swap every backend to it (its own update
where it applies, full weights where a backend is behind).

Semantics (docs/architecture.md, "Versions and the trainer"): the version row is the truth. It
is recorded, and `models.current_version` moves with it, in ONE transaction, before any backend
is touched; the trainer adds its ledger to that transaction. A backend that refuses a version
(or is not there) stays on its old one, out of date but verified, and the next publish (or a
trainer's start) brings it forward with full weights. So a refused or partial push leaves
nothing to clean up, and the next version is always `latest + 1`.

A model with a promotion gate (docs/governance.md) records a new version as its *candidate*
instead: `current_version` stays on the promoted one, and the candidate goes to one backend only
(`push`), where the gate judges it (trainer/gate/); the next version is built on the promoted
one, never on a candidate.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from rlgw.backend_state import ACTIVE, backends_of
from rlgw.db.models import Backend, PolicyVersion, PromotionGate, RegisteredModel
from rlgw.governance.version_status import CANDIDATE, PROMOTED
from rlgw.settings import Settings
from rlgw.version_lineage import head_version

from ..backends.parity import ProbeScores, reference_scores
from ..errors import UnknownModel, VersionConflict, VersionFilesUnavailable
from ..models.weights import state_dict
from ..swap.coordinator import CONTROL_TIMEOUT_S, SwapCoordinator, SwapPlan, SwapReport
from ..weight_update.base import WeightUpdate
from ..weight_update.files import FullFile
from ..weight_update.lora import CONFIG_FILE, LoraAdapter
from ..weight_update.native_offer import native_offer
from ..weight_update.remote import RemoteLora, ServedFile, VersionSource, remote
from ..weight_update.stored import stored_update
from .version_files import VersionFileServer, file_kind, version_files_token, version_url
from .versions import (
    BASE_KIND,
    file_sha256,
    latest_version,
    materialize,
    version_file,
)


@dataclass(frozen=True)
class Published:
    """A recorded version and its payload."""

    version: int
    parent: int
    update: WeightUpdate  # a stored one: FileUpdate or LoraAdapter
    candidate: bool = False  # the model has a gate: the version waits for its verdict
    # Publisher.record's wall seconds: write (the payload), checksum (its sha256), commit (the
    # version row, the caller's rows and the transaction's commit); trainer/loop/phases.py
    timings: dict[str, float] = field(default_factory=dict, compare=False)


def swap_metrics(reports: list[SwapReport]) -> dict[str, Any]:
    """What a version's row keeps of its swaps."""
    metrics: dict[str, Any] = {
        "pause_s": max((r.paused_s for r in reports), default=0.0),
        "swaps": {str(r.backend_id): r.outcome for r in reports},
    }
    fallbacks = {str(r.backend_id): r.fallback for r in reports if r.fallback}
    if fallbacks:  # RLGW_WEIGHT_TRANSFER asked for a native transfer these backends did not take
        metrics["transfer_fallbacks"] = fallbacks
    return metrics


class Publisher:
    """Versions of one model: record them, and install them on its backends."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        model_name: str,
        *,
        timeout_s: float = CONTROL_TIMEOUT_S,
        log: Callable[[str], None] = print,
    ) -> None:
        self.home = settings.home
        self.db_sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)
        with self.db_sessions() as db:
            model = db.scalar(select(RegisteredModel).where(RegisteredModel.name == model_name))
        if model is None:
            raise UnknownModel(model_name)
        self.model = model
        self.coordinator = SwapCoordinator(
            engine,
            drain_timeout_s=settings.drain_timeout_s,
            parity_tolerance=settings.parity_tolerance,
            http=httpx.Client(timeout=timeout_s),
            log=log,
        )
        # vLLM's native weight transfer, offered only when RLGW_WEIGHT_TRANSFER asks for it
        self.native = native_offer(
            settings.weight_transfer,
            checkpoint=model.path,
            host=settings.weight_transfer_host,
            timeout_s=timeout_s,
        )
        self.log = log
        self.files_server: VersionFileServer | None = None
        self.source: VersionSource | None = None
        self._sums: dict[str, str] = {}  # sha256 of anchor files (not recorded in the registry)
        self._probe_refs: dict[int, ProbeScores] = {}  # probe references of served old versions
        if settings.version_files_bind:
            self._serve_files(settings)

    def _serve_files(self, settings: Settings) -> None:
        """Serve this state directory's version files to backends on other hosts."""
        token = version_files_token(settings)
        try:
            self.files_server = VersionFileServer(self.home, settings.version_files_bind, token)
        except (OSError, ValueError) as exc:  # a malformed bind, a port in use
            self.coordinator.http.close()
            raise VersionFilesUnavailable(settings.version_files_bind, exc) from None
        self.files_server.__enter__()
        base = settings.version_files_url or f"http://{self.files_server.bound}"
        self.source = VersionSource(base, token)
        self.log(f"[publish] version files served at {base} to backends that cannot read them")

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        self.coordinator.http.close()
        if self.files_server is not None:
            self.files_server.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ versions
    def latest(self) -> tuple[int, torch.nn.Module]:
        """The promoted version and its reference model (what the next version is built on)."""
        with self.db_sessions() as db:
            version = head_version(db, self.model.id)
            return version, materialize(db, self.model, version)

    def gated(self) -> bool:
        """Whether the model has a promotion gate."""
        with self.db_sessions() as db:
            return db.get(PromotionGate, self.model.id) is not None

    def record(
        self,
        parent: int,
        payload: Any,
        kind: type[WeightUpdate],
        *,
        metrics: dict[str, Any] | None = None,
        rows: Callable[[Session, int], None] | None = None,
        guard: Callable[[Session], None] | None = None,
    ) -> Published:
        """Record the next version (numbered after the newest) with its payload (`kind.write`'s:
        tensors for a file, the trainer's peft model for a LoRA adapter), built on
        `parent`, as the model's current version, or as its candidate when it has a gate, in one
        transaction (`rows(db, version)` adds the caller's rows to it: the trainer's ledger;
        `guard(db)`, first under the model's lock, may raise to record nothing: the trainer's
        check that it still holds its sessions). Raises VersionConflict when `parent` is no
        longer the current version, or a candidate is being judged. The returned version's
        `timings` say how long the write, the checksum and the commit took."""
        with self.db_sessions() as db, db.begin():
            # The model's row lock orders publishers: the payload is written under it, so two
            # of them never write the same version's file.
            model = db.get(RegisteredModel, self.model.id, with_for_update=True)
            if guard is not None:
                guard(db)
            if model.current_version != parent or model.candidate_version is not None:
                raise VersionConflict(model.name, parent, model.current_version)
            version = latest_version(db, model.id) + 1
            candidate = db.get(PromotionGate, model.id) is not None
            path = version_file(self.home, model.name, version, kind.kind)
            started = time.perf_counter()
            update = kind.write(payload, path, model.name, version)
            written = time.perf_counter()
            checksum = file_sha256(update.payload_file)
            committing = time.perf_counter()
            timings = {"write": written - started, "checksum": committing - written}
            db.add(
                PolicyVersion(
                    model_id=model.id,
                    version=version,
                    parent_version=parent,
                    kind=update.kind,
                    weights_path=update.path,
                    checksum=checksum,
                    metrics={**(metrics or {}), "bytes": update.nbytes},
                    status=CANDIDATE if candidate else PROMOTED,
                )
            )
            if rows is not None:
                rows(db, version)
            if candidate:
                model.candidate_version = version
            else:
                model.current_version = version
        timings["commit"] = time.perf_counter() - committing  # the flush and COMMIT included
        return Published(version, parent, update, candidate, timings)

    def note(self, version: int, metrics: dict[str, Any]) -> None:
        """Add measurements (pause, swap outcomes) to a recorded version's metrics."""
        with self.db_sessions() as db, db.begin():
            row = db.scalar(self._row(version))
            row.metrics = {**row.metrics, **metrics}

    def _row(self, version: int):
        return select(PolicyVersion).where(
            PolicyVersion.model_id == self.model.id, PolicyVersion.version == version
        )

    # ------------------------------------------------------------------ backends
    def push(
        self,
        published: Published,
        model: torch.nn.Module | Mapping[str, torch.Tensor],
        *,
        reference_old: ProbeScores,
        backends: list[Backend] | None = None,
        reference_new: ProbeScores | None = None,
    ) -> list[SwapReport]:
        """Swap every backend (or `backends`; a candidate: its gate backend only) to
        `published`, whose weights `model` holds (or is: a version published in the background
        passes a copy of its weights, and their probe scores as `reference_new`); backends not at
        its parent get full weights."""
        fallback = None
        if published.update.relative and self._behind(published.parent):
            fallback = self._full(published.version, model)
        plan = SwapPlan(
            model_name=self.model.name,
            model_id=self.model.id,
            parent_version=published.parent,
            new_version=published.version,
            update=self.offered(published.update, published.version),
            reference_new=reference_new or reference_scores(model),
            reference_old=reference_old,
            fallback=None if fallback is None else self.offered(fallback, published.version),
            preferred=self._native(model, published.parent),
            reference_of=self.reference_of,
        )
        if backends is None and published.candidate:
            backends = self.gate_backend(published.parent)
        if backends is None:
            return self.coordinator.push(plan)
        return [self.coordinator.swap_backend(b, plan) for b in backends]

    def gate_backend(self, parent: int) -> list[Backend]:
        """The one backend a candidate goes to (the others keep serving the promoted version):
        the last one in routing on its parent, else the last one."""
        backends = self.coordinator.backends(self.model.id)
        serving = [b for b in backends if b.state == ACTIVE and b.served_version == parent]
        return (serving or backends)[-1:]

    def sync(self, version: int, model: torch.nn.Module) -> list[SwapReport]:
        """Bring the backends that serve another version to `version` (full weights)."""
        behind = self._behind(version)
        if not behind:
            return []
        self.log(f"[publish] {len(behind)} backend(s) behind version {version}: full sync")
        plan = SwapPlan(
            model_name=self.model.name,
            model_id=self.model.id,
            parent_version=version,
            new_version=version,
            update=self.offered(self._full(version, model), version),
            reference_new=reference_scores(model),
            preferred=self._native(model, None),
            reference_of=self.reference_of,
        )
        return [self.coordinator.swap_backend(b, plan) for b in behind]

    def _native(
        self, model: torch.nn.Module | Mapping[str, torch.Tensor], parent: int | None
    ) -> WeightUpdate | None:
        """vLLM's native transfer of `model`'s weights, when offered (experimental); a
        rollback re-sends `parent`'s weights, rebuilt from the version files only then."""
        if self.native is None:
            return None
        load_parent = None
        if parent is not None:
            load_parent = functools.cache(lambda: state_dict(self._reference(parent)))
        return self.native.update(_weights(model), load_parent)

    def reference_of(self, version: int) -> ProbeScores | None:
        """The probe reference of a recorded version, rebuilt from its files (a second copy of
        the model in memory, for a moment; kept per version once scored); None where it cannot
        be rebuilt. The coordinator asks for it only to measure the noise of a low-precision
        backend that serves another version than the update's parent."""
        if version not in self._probe_refs:
            try:
                reference = self._reference(version)
            except (LookupError, OSError, VersionFilesUnavailable) as exc:
                self.log(f"[publish] no reference for version {version}: {exc}")
                return None
            self._probe_refs[version] = reference_scores(reference)
        return self._probe_refs[version]

    def _reference(self, version: int) -> torch.nn.Module:
        with self.db_sessions() as db:
            return materialize(db, self.model, version)

    def offered(self, update: WeightUpdate, version: int) -> WeightUpdate:
        """`update` as backends get it: with a version-file server, also offered over HTTP
        (with the version's recorded sha256) to a backend that cannot read its path. A stored
        LoRA version likewise (`RemoteLora`): its weights with the recorded checksum (the
        registry keeps one per version, of `payload_file`), its config with the sha256 taken
        here, when it is offered; the backend loads its own verified copy of the folder."""
        path = Path(update.path)
        lora = isinstance(update, LoraAdapter)
        kind = LoraAdapter.kind if lora else file_kind(path)
        if self.source is None or kind is None:
            return update
        if path != version_file(self.home, self.model.name, version, kind):
            return update  # not a stored version file: the server does not serve it
        with self.db_sessions() as db:
            row = db.scalar(self._row(version))
        recorded = row.checksum if row is not None and row.weights_path == str(path) else None
        url = functools.partial(version_url, self.source.base_url, self.model.name, version)
        token = self.source.token
        if lora:
            if not recorded:
                return update  # no checksum to check a download against: read from the path
            config = ServedFile(url("lora-config"), file_sha256(path / CONFIG_FILE))
            weights = ServedFile(url("lora-weights"), recorded)
            return RemoteLora(
                path, self.model.name, version, config=config, weights=weights, token=token
            )
        if recorded:
            sha256 = recorded
        else:  # an anchor: its file is not the version's recorded one; hashed once
            sha256 = self._sums.get(str(path)) or file_sha256(path)
            self._sums[str(path)] = sha256
        return remote(update, url(kind), sha256, token)

    def _behind(self, version: int) -> list:
        """Backends serving another version than `version`, but for a candidate being judged."""
        with self.db_sessions() as db:
            candidate = db.get(RegisteredModel, self.model.id).candidate_version
            return [
                b
                for b in db.scalars(backends_of(self.model.id))
                if b.served_version not in (version, candidate) or b.served_version is None
            ]

    def _full(
        self, version: int, model: torch.nn.Module | Mapping[str, torch.Tensor]
    ) -> WeightUpdate:
        """What installs `version` from any version: its own payload when that is not relative
        (full weights, a LoRA adapter), else an anchor file of its full weights."""
        with self.db_sessions() as db:
            row = db.scalar(self._row(version))
        if row is not None and row.kind != BASE_KIND:
            own = stored_update(row.kind, row.weights_path, self.model.name, version)
            if not own.relative:
                return own
        anchor = version_file(self.home, self.model.name, version, "anchor")
        if not anchor.exists():
            FullFile.write(_weights(model), anchor)
        return FullFile(anchor)


def _weights(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights by name: a model's, or a mapping of them as it is."""
    return dict(model) if isinstance(model, Mapping) else state_dict(model)
