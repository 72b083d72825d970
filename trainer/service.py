"""`rlgw train`: the online trainer. Claim rewarded sessions, update the policy, commit the new
version with its ledger in one transaction, then push it to every backend through verified swaps.

Crash safety: the transaction that records a version also marks its sessions consumed and writes
the ledger, so an update either happened completely or not at all. A crash before it leaves the
sessions claimed by a dead instance: the next trainer releases and re-trains them (from the last
recorded version's weights). A crash after it leaves backends behind: the next trainer brings them
to the current version with full weights before training.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import torch
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from rlgw.backend_state import backends_of
from rlgw.db.models import AgentSession, Consumption, PolicyVersion, RegisteredModel
from rlgw.settings import Settings
from rlgw.trajectory import load_trajectory

from .claims import TrainerInstance, claim_sessions, release_dead_claims, unclaim
from .config import TrainerConfig
from .optimizer_state import restore_optimizer, save_optimizer, state_path
from .parity import reference_scores
from .samples import build_samples
from .swap.coordinator import SwapCoordinator, SwapPlan, SwapReport
from .update import policy_update
from .versions import file_sha256, materialize, version_file
from .weight_update.files import FullFile, stored_update
from .weights import delta, state_dict, write_update

FAULT_ENV = "RLGW_TRAINER_FAULT"  # test hook: "crash-before-commit" | "crash-after-commit"


def _maybe_crash(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        print(f"[train] injected fault: {point}", flush=True)
        os._exit(86)


@dataclass
class StepReport:
    version: int | None
    sessions: int
    samples: int
    skipped: int
    dropped: int
    metrics: dict[str, Any]
    swaps: list[SwapReport]


class OnlineTrainer:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        model_name: str,
        config: TrainerConfig,
        *,
        log=print,
    ) -> None:
        self.settings, self.engine, self.model_name, self.config = (
            settings,
            engine,
            model_name,
            config,
        )
        self.sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)
        self.log = log
        torch.manual_seed(config.seed)
        self.instance = TrainerInstance(engine)
        with self.sessions() as db, db.begin():
            self.model_row = db.scalar(
                select(RegisteredModel).where(RegisteredModel.name == model_name)
            )
            if self.model_row is None:
                raise LookupError(f"no model named {model_name!r}")
            released = release_dead_claims(db)
            self.version = self.model_row.current_version
            self.model = materialize(db, self.model_row, self.version)
        if released:
            self.log(f"[train] released {released} session(s) claimed by a stopped trainer")
        self.model.eval()
        self.served = {k: v.clone() for k, v in state_dict(self.model).items()}
        self.pad_id = int(self.model.config.pad_token_id or self.model.config.eos_token_id or 0)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.optimizer_path = state_path(settings.home, model_name)
        self.log(f"[train] {restore_optimizer(self.optimizer, self.optimizer_path, self.version)}")
        self.coordinator = SwapCoordinator(
            engine,
            drain_timeout_s=settings.drain_timeout_s,
            parity_tolerance=settings.parity_tolerance,
            log=log,
        )
        self.log(f"[train] {model_name}: starting from version {self.version}")
        self.sync_backends()

    def close(self) -> None:
        self.instance.close()

    # ------------------------------------------------------------------ weights out
    def _full_file(self, version: int) -> str:
        path = version_file(self.settings.home, self.model_name, version, "anchor")
        if not path.exists():
            write_update(state_dict(self.model), path)
        return str(path)

    def sync_backends(self) -> list[SwapReport]:
        """Bring backends that serve another version to the current one (full weights)."""
        with self.sessions() as db:
            behind = [
                b
                for b in db.scalars(backends_of(self.model_row.id))
                if b.served_version != self.version
            ]
        if not behind:
            return []
        self.log(f"[train] {len(behind)} backend(s) behind version {self.version}: full sync")
        plan = SwapPlan(
            model_name=self.model_name,
            model_id=self.model_row.id,
            parent_version=self.version,
            new_version=self.version,
            update=FullFile(self._full_file(self.version)),
            reference_new=reference_scores(self.model),
        )
        return [self.coordinator.swap_backend(b, plan) for b in behind]

    # ------------------------------------------------------------------ one update
    def step(self) -> StepReport | None:
        """One update if enough data is eligible; None otherwise."""
        t0 = time.perf_counter()
        now = datetime.now(UTC)
        with self.sessions() as db, db.begin():
            claim = claim_sessions(
                db,
                model=self.model_name,
                instance_id=self.instance.id,
                max_sessions=self.config.batch_sessions,
                reward_deadline_s=self.settings.group_deadline_s,
                now=now,
            )
            if 0 < len(claim.session_ids) < self.config.min_sessions:
                unclaim(db, claim.session_ids)
                claim.session_ids = []
        if claim.dropped:
            self.log(
                f"[train] dropped {len(claim.dropped)} session(s): "
                f"{next(iter(claim.dropped.values()))}"
            )
        if not claim.session_ids:
            return None
        with self.sessions() as db:
            trajectories = [load_trajectory(db, sid, now) for sid in claim.session_ids]
        samples, skips = build_samples(
            [t for t in trajectories if t], current_version=self.version, config=self.config
        )
        if not samples:  # nothing trainable: the sessions are spent, say why
            with self.sessions() as db, db.begin():
                for sid in claim.session_ids:
                    session = db.get(AgentSession, sid)
                    session.status = "dropped"
                    session.dropped_reason = (
                        "; ".join(sorted({s.reason for s in skips if s.session_id == sid}))
                        or "no steps"
                    )
            return StepReport(
                None, len(claim.session_ids), 0, len(skips), len(claim.session_ids), {}, []
            )

        before = reference_scores(self.model)
        metrics = policy_update(self.model, self.optimizer, samples, self.config, self.pad_id)
        returns = [t.return_raw for t in trajectories if t and t.return_raw is not None]
        metrics["reward_mean"] = sum(returns) / len(returns) if returns else 0.0
        metrics["train_s"] = time.perf_counter() - t0
        _maybe_crash("crash-before-commit")

        new_version = self.version + 1
        kind = "full" if new_version % self.config.anchor_every == 0 else "delta"
        weights = state_dict(self.model)
        update_tensors = weights if kind == "full" else delta(weights, self.served)
        path = version_file(self.settings.home, self.model_name, new_version, kind)
        metrics["bytes"] = write_update(update_tensors, path)
        self._commit(new_version, kind, path, metrics, samples, skips, claim.session_ids)
        save_optimizer(self.optimizer, self.optimizer_path, new_version)
        _maybe_crash("crash-after-commit")

        plan = SwapPlan(
            model_name=self.model_name,
            model_id=self.model_row.id,
            parent_version=self.version,
            new_version=new_version,
            update=stored_update(kind, path),
            reference_new=reference_scores(self.model),
            reference_old=before,
            fallback=FullFile(self._full_file(new_version)) if self._any_behind() else None,
        )
        self.version = new_version
        self.served = {k: v.clone() for k, v in weights.items()}
        swaps = self.coordinator.push(plan)
        metrics["pause_s"] = max((s.paused_s for s in swaps), default=0.0)
        metrics["step_s"] = time.perf_counter() - t0
        self._record_swap_metrics(new_version, metrics, swaps)
        report = StepReport(
            new_version,
            len(claim.session_ids),
            len(samples),
            len(skips),
            len(claim.dropped),
            metrics,
            swaps,
        )
        self.log(self._progress_line(report))
        return report

    def _any_behind(self) -> bool:
        with self.sessions() as db:
            return any(
                b.served_version != self.version for b in db.scalars(backends_of(self.model_row.id))
            )

    def _commit(
        self,
        version: int,
        kind: str,
        path,
        metrics: dict[str, Any],
        samples,
        skips,
        session_ids: list[str],
    ) -> None:
        """The version, its ledger and the consumed sessions: all or nothing."""
        now = datetime.now(UTC)
        with self.sessions() as db, db.begin():
            db.add(
                PolicyVersion(
                    model_id=self.model_row.id,
                    version=version,
                    parent_version=self.version,
                    kind=kind,
                    weights_path=str(path),
                    checksum=file_sha256(path),
                    metrics={**metrics, "config": self.config.as_dict()},
                )
            )
            db.add_all(
                Consumption(
                    model_id=self.model_row.id,
                    version=version,
                    session_id=s.session_id,
                    completion_id=s.completion_id,
                    used=True,
                    tokens=len(s.output_ids),
                    advantage=s.advantage,
                )
                for s in samples
            )
            db.add_all(
                Consumption(
                    model_id=self.model_row.id,
                    version=version,
                    session_id=s.session_id,
                    completion_id=s.completion_id,
                    used=False,
                    reason=s.reason,
                )
                for s in skips
            )
            for sid in session_ids:
                session = db.get(AgentSession, sid)
                session.status, session.consumed_at = "consumed", now
            db.get(RegisteredModel, self.model_row.id).current_version = version

    def _record_swap_metrics(
        self, version: int, metrics: dict[str, Any], swaps: list[SwapReport]
    ) -> None:
        with self.sessions() as db, db.begin():
            row = db.scalar(
                select(PolicyVersion).where(
                    PolicyVersion.model_id == self.model_row.id, PolicyVersion.version == version
                )
            )
            row.metrics = {
                **row.metrics,
                "pause_s": metrics["pause_s"],
                "step_s": metrics["step_s"],
                "swaps": {str(s.backend_id): s.outcome for s in swaps},
            }

    @staticmethod
    def _progress_line(r: StepReport) -> str:
        m = r.metrics
        outcomes = ",".join(s.outcome for s in r.swaps) or "no backends"
        return (
            f"[train] v{r.version:<4d} sessions {r.sessions:3d}  samples {r.samples:3d}  "
            f"tokens {int(m.get('tokens', 0)):5d}  reward {m.get('reward_mean', 0):.3f}  "
            f"loss {m.get('loss', 0):+.4f}  kl {m.get('kl_behave', 0):+.4f}  "
            f"clip {m.get('clip_frac', 0):.2f}  pause {m.get('pause_s', 0):.3f}s  "
            f"step {m.get('step_s', 0):.2f}s  [{outcomes}]"
        )

    # ------------------------------------------------------------------ the service
    def run(
        self,
        *,
        poll_s: float = 0.5,
        max_versions: int | None = None,
        stop_after_s: float | None = None,
    ) -> None:
        started = time.monotonic()
        made = 0
        while max_versions is None or made < max_versions:
            if stop_after_s is not None and time.monotonic() - started > stop_after_s:
                return
            report = self.step()
            if report is None or report.version is None:
                time.sleep(poll_s)
                continue
            made += 1
