"""`rlgw train`: the online trainer. Claim rewarded sessions, update the policy, commit the new
version with its ledger in one transaction, then push it to every backend through verified swaps.
Under `rlgw train` (`run`) and `rlgw demo` (`advance`), the commit and the push of version N run in
the background while N+1 claims and computes (trainer/loop/version_publishing.py); `step` does it
all before it returns.

Crash safety: the transaction that records a version also marks its sessions consumed and writes
the ledger, so an update either happened completely or not at all. A crash before it leaves the
sessions claimed by a dead instance: the next trainer releases and re-trains them (from the last
recorded version's weights). A trainer that is stopped rather than dead (SIGSTOP, a frozen VM,
cut off) loses its claims when their lease passes (trainer/loop/leases.py); continued, it commits
nothing it no longer holds and goes back to the last committed version. A crash after it leaves
backends behind: the next trainer brings them to the current version with full weights before
training. Versions are recorded and pushed by the publisher that `rlgw push` uses too
(`trainer/publishing/publish.py`); a version published by someone else while this trainer trained
makes its commit a VersionConflict: the sessions go back to the queue.

Governance (docs/governance.md): before each update the trainer carries out the rollbacks asked
for over the admin API and follows a moved head (a rollback, a rejected candidate) with that
version's weights and, when kept, its AdamW moments; it claims only sessions whose tenant
consents; and on a gated model the version it records is a candidate, judged by its gate
(trainer/gate/) before it serves all traffic, while the trainer waits for the verdict.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import torch
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from rlgw import test_hooks
from rlgw.db.models import AgentSession
from rlgw.placement import Placement
from rlgw.settings import Settings
from rlgw.trajectory import load_trajectory
from rlgw.version_lineage import head_version, lineage

from ..backends.parity import ProbeScores, reference_scores
from ..config import TrainerConfig
from ..errors import VersionConflict, database_errors
from ..gate.governor import Governor
from ..models.lora import with_adapter
from ..models.weights import state_dict
from ..publishing.publish import Published, Publisher
from ..publishing.versions import materialize, settle_mode
from ..swap.coordinator import SwapReport
from ..swap.hold import GenerationHold, NoHold
from . import collectives
from .advantages import NON_FINITE, session_advantages
from .claims import Claim, TrainerInstance, claim_sessions, held, release_dead_claims, unclaim
from .device import slow_bf16_warning
from .distributed import init_distributed, is_rank0
from .inflight import InFlight, PendingVersion
from .leases import ClaimLost, Heartbeat
from .ledger import record_ledger
from .optimizer_state import state_path
from .payload import version_payload
from .phases import PhaseClock
from .policy import Policy
from .samples import build_update
from .settle import settle_dropped
from .task_baseline import task_means
from .tracking import RunLog, skipped_fractions
from .update import NonFiniteUpdate, UpdateOutOfMemory
from .version_publishing import StepReport, VersionPublishing

NO_SIGNAL = "no learning signal: every advantage in the batch is zero (equal rewards)"


class OnlineTrainer(VersionPublishing):
    """The trainer of one model. Under torch.distributed every rank makes one, and rank 0 alone
    touches the database and the backends: it claims sessions, records versions and the ledger,
    and pushes; the other ranks take part in the update (FSDP2 shards) and nothing else."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine | None,
        model_name: str,
        config: TrainerConfig,
        *,
        placement: Placement | None = None,
        wandb_project: str | None = None,
        log=print,
    ) -> None:
        self.settings, self.engine, self.model_name, self.config = (
            settings,
            engine,
            model_name,
            config,
        )
        self.log = log
        self.placement = placement or Placement()
        self._short_since: float | None = None  # colocated: a short batch first waited then
        torch.manual_seed(config.seed)
        self.dist = init_distributed(config.device, settings.dist_timeout_s)
        self.rank0 = is_rank0()
        self.version, reference, base_path = 0, None, None
        self.inflight: InFlight | None = None  # a version being published in the background
        self.launched_scores: ProbeScores | None = None  # its probe scores, until the next update
        if self.rank0:
            self.db_sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)
            with database_errors():
                self.publisher = Publisher(settings, engine, model_name, log=log)  # UnknownModel
                self.instance = TrainerInstance(engine)
                self.heartbeat = Heartbeat(engine, self.instance.id, settings.claim_lease_s, log)
                with self.db_sessions() as db, db.begin():
                    released = release_dead_claims(db)
                    # LoRA or full weights: as the model's trained versions were made
                    self.config = config = settle_mode(db, self.publisher.model, config)
                self.version, reference = self.publisher.latest()
            base_path = self.publisher.model.path
            if released:
                self.log(f"[train] released {released} session(s) claimed by a stopped trainer")
        self.policy = Policy.for_rank(reference, base_path, config, self.dist)
        self.config = config = self.policy.config  # rank 0's, on every rank
        self.model = self.policy.reference  # rank 0: the current version's weights, fp32, CPU
        self.optimizer_path = state_path(settings.home, model_name)
        restored = self.policy.restore_moments(self.optimizer_path, self.version)
        if not self.rank0:
            return
        self._remember_served()
        where = f"{self.dist.device}, {config.dtype}, {self.dist.world_size} process(es)"
        if self.policy.lora is not None:
            lora = self.policy.lora
            where += f", LoRA rank {lora.rank} alpha {lora.alpha:g} on {lora.targets or 'defaults'}"
        self.log(f"[train] {restored}")
        self.log(f"[train] config: {config.describe()}")
        self.log(f"[train] {model_name}: starting from version {self.version} on {where}")
        if warning := slow_bf16_warning(self.dist.device, config.dtype):
            self.log(f"[train] warning: {warning}")
        self.governor = Governor(settings, self.publisher, log=log)
        self.run_log = RunLog(
            settings.home / "runs" / model_name,
            wandb_project=wandb_project,
            config=config.as_dict(),
            log=log,
        )
        with database_errors():
            self.governor.recover()  # a candidate whose evaluation was cut off is rejected
            self.sync_backends()

    def _continue_from(self, version: int) -> None:
        """Train on from `version` (a rollback moved the head, or the gate rejected a candidate):
        its weights, rebuilt from the version files, and its AdamW moments when they were kept
        (the state saved before the latest one: a rejected candidate's parent), else fresh ones.
        The moments of the rejected or rolled-back updates are never carried over."""
        with self.db_sessions() as db:
            reference = materialize(db, self.publisher.model, version)
        if self.policy.lora is not None:  # version 0 of a LoRA model: a new (zero) adapter
            reference = with_adapter(reference, self.policy.lora)
        self._tell("reload", version)
        message = self.policy.reset_to(state_dict(reference), self.optimizer_path, version)
        self.version, self.launched_scores = version, None
        self._remember_served()
        self.log(f"[train] {message}")
        self.log(f"[train] {self.model_name}: continuing from version {version}")

    def _remember_served(self) -> None:
        """Keep the served weights, which the next delta is taken against (LoRA: unneeded, an
        adapter is never a difference)."""
        lora = self.policy.lora is not None
        self.served = {} if lora else {k: v.clone() for k, v in state_dict(self.model).items()}

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.policy.optimizer

    def close(self) -> None:
        if self.rank0:
            self.heartbeat.stop()
            self.instance.close()
            self.publisher.close()
            self.run_log.close()

    def _update_window(self) -> GenerationHold | NoHold:
        """Where generation stands while this process updates: paused when colocated (it gets
        the cores, or the device, to itself), running beside it otherwise."""
        if not (self.rank0 and self.placement.pauses_generation):
            return NoHold()
        # vLLM's sleep frees a GPU; on the CPU build it only pauses the scheduler (done already)
        sleep_level = 1 if self.dist.device.type == "cuda" else None
        coordinator, model_id = self.publisher.coordinator, self.publisher.model.id
        return GenerationHold(coordinator, model_id, sleep_level=sleep_level, log=self.log)

    def sync_backends(self) -> list[SwapReport]:
        """Bring backends that serve another version to the current one (full weights)."""
        return self.publisher.sync(self.version, self.model)

    # ------------------------------------------------------------------ one update
    def _claim(self, now: datetime, clock: PhaseClock):
        """Rank 0: the sessions of the next update and their samples; a StepReport instead when
        what was claimed holds nothing trainable (the sessions are spent, with the reasons).
        `clock` times the claim, load and build phases."""
        with clock.phase("claim"), self.db_sessions() as db, db.begin():
            claim = claim_sessions(
                db,
                model=self.model_name,
                instance_id=self.instance.id,
                max_sessions=self.config.batch_sessions,
                reward_deadline_s=self.settings.group_deadline_s,
                now=now,
                lease_s=self.settings.claim_lease_s,
                consent=self.settings.training_consent,
            )
            # too few to update on, unless whole groups cannot fill the batch any better
            if 0 < len(claim.session_ids) < self._batch_floor() and not claim.full:
                unclaim(db, claim.session_ids, self.instance.id)
                claim.session_ids = []
            self._short_since = None if claim.session_ids else self._short_since
        if claim.released:
            self.log(
                f"[train] released {len(claim.released)} session(s) whose claim lease passed "
                "(their trainer stopped renewing it)"
            )
        if claim.dropped:
            self.log(
                f"[train] dropped {len(claim.dropped)} session(s): "
                f"{next(iter(claim.dropped.values()))}"
            )
        if not claim.session_ids:
            return None
        with clock.phase("load"), self.db_sessions() as db:
            trajectories = [load_trajectory(db, sid, now) for sid in claim.session_ids]
            depths = self._lineage(db)
            loaded = [t for t in trajectories if t]
            means = (
                task_means(db, self.publisher.model.id, [t.task_id for t in loaded if t.task_id])
                if self.config.singleton_baseline == "task_mean"
                else None
            )
        with clock.phase("load"):
            advantages = session_advantages(loaded, self.config, means)
        with clock.phase("build"):
            built = build_update(
                loaded,
                current_version=self.version,
                config=self.config,
                lineage=depths,
                model=self.model_name,
                vocab_size=self.model.get_input_embeddings().num_embeddings,
                advantages=advantages.of,
            )
        samples, skips = built.samples, built.skips
        # Sessions the update must not use at all: a non-finite advantage (theirs, or a sibling
        # choice's), a group without variance when filtered. Dropped now, before the update.
        dropped = dict(advantages.dropped)
        for skip in skips:
            if skip.reason.startswith(NON_FINITE):
                dropped.setdefault(skip.session_id, skip.reason)
        fractions = skipped_fractions(samples, skips, dropped)
        # the cuts that begin the update's sequences (metrics["cuts"]), of the sessions it keeps
        cuts = built.cut_counts(exclude=dropped)
        if dropped:
            self._drop(dropped)
            claim.session_ids = [sid for sid in claim.session_ids if sid not in dropped]
            trajectories = [t for t in trajectories if t and t.session_id not in dropped]
            samples = [s for s in samples if s.session_id not in dropped]
            skips = [s for s in skips if s.session_id not in dropped]
            if not claim.session_ids:
                return StepReport(None, len(dropped), 0, 0, len(dropped), {}, [])
        # Nothing trainable, or nothing to learn (every advantage zero: each group's members got
        # the same reward, so the gradient is zero): no version; the sessions are spent, say why.
        silent = bool(samples) and not any(s.advantage for s in samples)
        if not samples or silent:
            with self.db_sessions() as db, db.begin():
                still = db.scalars(  # only what this trainer still holds (its lease not passed)
                    select(AgentSession)
                    .where(AgentSession.id.in_(claim.session_ids), held(self.instance.id))
                    .order_by(AgentSession.id)
                    .with_for_update()
                ).all()
                for session in still:
                    skipped = sorted({s.reason for s in skips if s.session_id == session.id})
                    reason = "; ".join(skipped) or (NO_SIGNAL if silent else "no steps")
                    settle_dropped(db, session, self.publisher.model.id, reason, now)
            if silent:
                self.log(f"[train] {len(claim.session_ids)} session(s) dropped: {NO_SIGNAL}")
            return StepReport(
                None, len(claim.session_ids), 0, len(skips), len(claim.session_ids), {}, []
            )
        claim.dropped.update(dropped)
        return claim, trajectories, samples, skips, fractions, cuts

    def _lineage(self, db: Session) -> dict[int, int]:
        """The trainer's version and its ancestors, by distance (the staleness bound's ruler);
        a version still in flight is counted as recorded on its parent."""
        if self.inflight is None:
            return lineage(db, self.publisher.model.id, self.version)
        parent = self.inflight.outcome.pending.parent
        ancestors = lineage(db, self.publisher.model.id, parent)
        return {self.version: 0, **{v: d + 1 for v, d in ancestors.items()}}

    def _drop(self, reasons: dict[str, str]) -> None:
        """Drop claimed sessions for this model, each with its reason (only those this trainer
        still holds; a session another model has still to train on goes back to the queue for
        it, trainer/loop/settle.py), and say so."""
        now = datetime.now(UTC)
        with self.db_sessions() as db, db.begin():
            still = db.scalars(
                select(AgentSession)
                .where(AgentSession.id.in_(list(reasons)), held(self.instance.id))
                .order_by(AgentSession.id)
                .with_for_update()
            ).all()
            for session in still:
                settle_dropped(db, session, self.publisher.model.id, reasons[session.id], now)
        self.log(f"[train] dropped {len(reasons)} session(s): {next(iter(reasons.values()))}")

    def _tell(self, command: str, payload: Any = None) -> None:
        """Rank 0 tells the other ranks what this step is: train (with the samples and the
        version they update), reload (a version), idle, stop."""
        if self.dist.world_size > 1:
            collectives.broadcast_object((command, payload))

    def follow(self) -> bool:
        """Ranks other than 0: take part in the step rank 0 announces; False once it stops."""
        command, payload = collectives.broadcast_object(None)
        if command == "train":
            samples, version = payload
            try:
                self.policy.update(samples, version)
            except NonFiniteUpdate:  # every rank skips it together (the check is all-reduced)
                return True
            self.policy.weights()
            self.policy.gather_moments()  # rank 0 saves them once it has recorded the version
        elif command == "reload":  # rank 0 moved to another version: its weights, its moments
            self.policy.reset_to(None, self.optimizer_path, payload)
        return command != "stop"

    def step(self) -> StepReport | None:
        """Rank 0: one update if enough data is eligible, its version recorded and pushed before
        this returns; None otherwise."""
        return self._advance(overlap=False)

    def _govern(self) -> bool:
        """Before an update: the rollbacks asked for, a canary settled (False while a candidate
        is still being judged: no update now), and a moved head followed (a rollback, a
        rejected candidate: the trainer continues from it)."""
        if not self.governor.tick():
            return False
        with self.db_sessions() as db:
            head = head_version(db, self.publisher.model.id)
        if head != self.version:
            self._continue_from(head)
        return True

    def _batch_floor(self) -> int:
        """The sessions an update waits for: `min_sessions`; where generation pauses for each
        update (colocated), a full batch, until the first claim found short has waited
        RLGW_COLOCATED_BATCH_WAIT_S (then whatever is eligible trains)."""
        if not self.placement.pauses_generation:
            return self.config.min_sessions
        now = time.monotonic()
        if self._short_since is None:
            self._short_since = now
        if now - self._short_since >= self.settings.colocated_batch_wait_s:
            return self.config.min_sessions
        return self.config.batch_sessions

    def _overlaps(self) -> bool:
        """Whether a version may be published in the background while the next update computes
        (`overlap_publish`): not where generation is paused for updates (colocated), not on a
        gated model (the next update waits for the verdict), not with vLLM's native transfer
        (it reads the live model)."""
        return (
            self.config.overlap_publish
            and not self.placement.pauses_generation
            and self.publisher.native is None
            and not self.publisher.gated()
        )

    def advance(self) -> StepReport | None:
        """Rank 0: `step`, with the version published in the background where `_overlaps`
        allows: returns the report of a version finished meanwhile, if any (`finish` waits for
        the one still in flight)."""
        return self._advance(overlap=self._overlaps())

    def _advance(self, overlap: bool) -> StepReport | None:
        """One update. With `overlap`, its version is recorded and pushed in the background
        (trainer/loop/inflight.py) while the next call claims and computes, and a call returns
        the report of the version it saw finished (the one in flight before it), if any."""
        if self.inflight is None and not self._govern():
            self._tell("idle")
            return None
        # claim sessions and build their samples
        t0 = time.perf_counter()
        now = datetime.now(UTC)
        clock = PhaseClock()  # where the step's time goes (trainer/loop/phases.py)
        claimed = self._claim(now, clock)
        if not isinstance(claimed, tuple):
            self._tell("idle")
            finished, _ = self._finish()  # nothing to train: the version in flight, if any
            return finished if finished is not None else claimed
        claim, trajectories, samples, skips, fractions, cuts = claimed
        if self.inflight is None:
            self.governor.baseline(self.version)  # the promoted version's score, while it serves
        with self._update_window() as window:
            # update the policy (every rank)
            self._tell("train", (samples, self.version))
            # the probe scores of the weights it starts from: taken by the last launch, if any
            before, self.launched_scores = self.launched_scores, None
            before = before or reference_scores(self.model)
            try:
                metrics = self.policy.update(samples, self.version)
            except UpdateOutOfMemory:
                self._finish()
                with self.db_sessions() as db, db.begin():
                    # back to the queue, for a smaller setting
                    unclaim(db, claim.session_ids, self.instance.id)
                raise
            except NonFiniteUpdate as err:
                finished, _ = self._finish()
                skipped = self._skip_update(err, claim, samples, skips)
                return finished if finished is not None else skipped
            clock.take_update(metrics)  # its proximal, forward_backward, optimizer seconds
            with clock.phase("gather"):
                weights = self.policy.weights()  # the reference (self.model) holds them now
                moments = self.policy.gather_moments()  # the last collective of the step
            returns = [t.return_raw for t in trajectories if t and t.return_raw is not None]
            metrics["reward_mean"] = sum(returns) / len(returns) if returns else 0.0
            metrics["train_s"] = time.perf_counter() - t0
            metrics["skipped_frac"] = fractions  # of the claimed completions, by reason kind
            metrics["cuts"] = cuts  # the update's sequences, by the cut that begins each
            finished = None
            if self.inflight is not None:  # the version this update was built on
                finished, recorded = self._finish()
                base = self.version
                if not recorded or not self._govern() or self.version != base:
                    # not recorded (the trainer is back on the head), a canary being judged,
                    # or a moved head (followed): this update was built on no head
                    self._discard(claim.session_ids, reload=recorded and self.version == base)
                    return finished
            test_hooks.crash_point("crash-before-commit")
            test_hooks.commit_delay()
            with clock.phase("delta"):
                payload, kind = version_payload(
                    self.policy.lora is not None,
                    self.model,
                    weights,
                    self.served,
                    self.version + 1,
                    self.config.anchor_every,
                    self.config.delta_dtype,
                )
            pending = PendingVersion(
                parent=self.version,
                payload=payload,
                kind=kind,
                metrics=metrics,
                session_ids=claim.session_ids,
                ledger=lambda db, version: record_ledger(
                    db, self.publisher.model.id, version, samples, skips, claim.session_ids
                ),
                moments=moments,
                weights=self.model,
                reference_old=before,
                clock=clock,
                started=t0,
                claimed_at=now,
                report_args=(claim, trajectories, samples, skips),
            )
            if overlap:
                self._launch(pending)
                return finished

            # its probe scores: the swap's reference, then the next update's starting point
            pending.reference_new = reference_scores(self.model)

            # record the version and its ledger in one transaction, then push it
            def committed(published: Published) -> None:
                self.version = published.version
                self._remember_served()
                self.launched_scores = pending.reference_new
                window.wake()

            held = window.report is not None  # generation paused: the moments wait for it
            try:
                published, swaps = self._publish(pending, committed, moments=not held)
            except (ClaimLost, VersionConflict) as error:
                self._not_recorded(error, pending)
                return None
        if held:  # written while generation runs again, not while it waits
            self._save_moments(pending, published)
        # a gated model: the gate judges the candidate before it serves all traffic
        if published.candidate:
            verdict = self.governor.judge(published, self.model, before)
            swaps += verdict.swaps
            metrics["gate"] = verdict.outcome
            if verdict.outcome != "canary" and verdict.head != self.version:  # rejected
                self._continue_from(verdict.head)
        if window.report is not None:
            metrics["hold_s"] = window.report.held_s
        return self._published(pending, published, swaps)

    def _skip_update(
        self, err: NonFiniteUpdate, claim: Claim, samples: list, skips: list
    ) -> StepReport:
        """A non-finite loss or gradient norm: no version. The weights and the AdamW state are
        as before the update (policy_update restored them); the sessions are dropped with the
        reason, so they cannot poison the next update too."""
        reason = f"{err} (no version; weights and optimizer state unchanged)"
        self._drop(dict.fromkeys(claim.session_ids, reason))
        self.log(f"[train] update skipped: {reason}")
        n = len(claim.session_ids)
        return StepReport(None, n, len(samples), len(skips), n, {"non_finite": 1.0}, [])

    # ------------------------------------------------------------------ the service
    def run(
        self,
        *,
        poll_s: float = 0.5,
        max_versions: int | None = None,
        stop_after_s: float | None = None,
    ) -> None:
        if not self.rank0:
            while self.follow():
                pass
            return
        started = time.monotonic()
        made = 0  # versions recorded and pushed
        try:
            while max_versions is None or made < max_versions:
                if stop_after_s is not None and time.monotonic() - started > stop_after_s:
                    return
                with database_errors():
                    if self.inflight is not None and made + 1 == max_versions:
                        report = self.finish()  # the last one: nothing more to start
                    else:
                        report = self.advance()
                if report is None or report.version is None:
                    if self.inflight is None:
                        time.sleep(poll_s)
                    continue
                made += 1
        finally:
            try:
                with database_errors():
                    self.finish()  # a version in flight is recorded and pushed, or given back
            finally:
                self.stop_followers()

    def stop_followers(self) -> None:
        """Rank 0: tell the other ranks that training is over (their `follow()` returns False);
        `run` does it on its way out, however it ends."""
        with contextlib.suppress(Exception):  # a rank already gone must not hide the cause
            self._tell("stop")
