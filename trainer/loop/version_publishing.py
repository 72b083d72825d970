"""How the online trainer records, pushes and reports a trained version: on its own thread (`step`),
or in the background while the next update computes (`advance`, trainer/loop/inflight.py).

A mixin of `OnlineTrainer` (trainer/loop/service.py), which holds the state it works on: the
publisher, the policy, the claim's instance, the version the trainer's weights are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlgw import test_hooks
from rlgw.governance.rollbacks import rolled_back_since
from rlgw.version_lineage import head_version

from ..backends.parity import ProbeScores, reference_scores
from ..errors import VersionConflict
from ..publishing.publish import Published, swap_metrics
from ..publishing.versions import latest_version
from ..swap.coordinator import SwapReport
from ..weight_update.files import FullFile
from .claims import Claim, unclaim
from .finite import finite_metrics
from .inflight import FrozenAdapter, InFlight, PendingVersion
from .leases import ClaimLost, check_held
from .phases import phases_line
from .tracking import rejected_outputs, version_scalars


@dataclass
class StepReport:
    version: int | None
    sessions: int
    samples: int
    skipped: int
    dropped: int
    metrics: dict[str, Any]
    swaps: list[SwapReport]


class VersionPublishing:
    """Recording, pushing and reporting versions (see the module docstring)."""

    inflight: InFlight | None
    launched_scores: ProbeScores | None

    def _lost(self, lost: ClaimLost, session_ids: list[str]) -> None:
        """The update's claim was lost before its commit (its lease passed: this trainer was
        stopped or cut off longer than RLGW_CLAIM_LEASE_S, and another may have trained those
        sessions): nothing was recorded; give back what is still held, and go back to the
        last committed version's weights and AdamW moments, as if the update never ran."""
        self.log(f"[train] {lost}: this update is not committed (no version, no ledger)")
        with self.db_sessions() as db, db.begin():
            unclaim(db, [s for s in session_ids if s not in lost.lost], self.instance.id)
        with self.db_sessions() as db:
            head = head_version(db, self.publisher.model.id)
        self._continue_from(head)

    def finish(self) -> StepReport | None:
        """Rank 0: the version in flight, recorded and pushed: its report (None if none was in
        flight, or it could not be recorded)."""
        return self._finish()[0]

    def _publish(
        self,
        pending: PendingVersion,
        committed: Callable[[Published], None] | None = None,
        *,
        moments: bool = True,
    ) -> tuple[Published, list[SwapReport]]:
        """Record `pending` with its ledger in one transaction, save the AdamW moments it
        reached (unless `moments` is False: the caller saves them, `_save_moments`), then push
        it to every backend: on the trainer's thread, or in the background
        (`committed(published)` runs between the commit and the push)."""
        published = self.publisher.record(
            pending.parent,
            pending.payload,
            pending.kind,
            # No NaN or inf reaches the database (JSON has none; Postgres refuses them)
            metrics=finite_metrics({**pending.metrics, "config": self.config.as_dict()}),
            rows=pending.ledger,
            guard=lambda db: check_held(db, pending.session_ids, self.instance.id),
        )
        pending.metrics["bytes"] = published.update.nbytes
        for name, seconds in published.timings.items():  # write, checksum, commit
            pending.clock.add(name, seconds)
        if moments:
            self._save_moments(pending, published)
        test_hooks.crash_point("crash-after-commit")
        if committed is not None:
            committed(published)
        swaps = self.publisher.push(
            published,
            pending.weights,
            reference_old=pending.reference_old,
            reference_new=pending.reference_new,
        )
        return published, swaps

    def _save_moments(self, pending: PendingVersion, published: Published) -> None:
        """The AdamW moments the committed version reached, for a restart to continue from (a
        stop before they are written restarts them at zero: optimizer_state.py)."""
        with pending.clock.phase("moments"):
            self.policy.save_moments(pending.moments, self.optimizer_path, published.version)

    def _launch(self, pending: PendingVersion) -> None:
        """Publish `pending` in the background. Everything it holds is made its own first (the
        next update changes the model and the optimizer in place), and the trainer takes on the
        version it will be: the next update's samples are judged against it."""
        lora = self.policy.lora is not None
        with pending.clock.phase("launch"):
            pending.reference_new = self.launched_scores = reference_scores(self.model)
            pending.moments = self.policy.freeze_moments(pending.moments)
            with self.db_sessions() as db:
                pending.expected = latest_version(db, self.publisher.model.id) + 1
            self.version = pending.expected
            self._remember_served()  # a copy of its weights, which the next delta is taken against
            pending.weights = self.served
            if lora:
                pending.payload = FrozenAdapter(self.model)
            elif pending.kind is FullFile:
                pending.payload = self.served
        self.inflight = InFlight(pending, self._publish)

    def _finish(self) -> tuple[StepReport | None, bool]:
        """Wait for the version in flight: (its report, True) once it is recorded and pushed;
        (None, False) if it was not recorded (the trainer is then back on the head's weights)
        or none was in flight."""
        if self.inflight is None:
            return None, False
        outcome, self.inflight = self.inflight.join(), None
        if isinstance(outcome.error, ClaimLost | VersionConflict):
            self._not_recorded(outcome.error, outcome.pending)
            with self.db_sessions() as db:
                head = head_version(db, self.publisher.model.id)
            if head != self.version:
                self._continue_from(head)
            return None, False
        if outcome.error is not None:
            raise outcome.error
        published = outcome.published
        self.version = published.version
        return self._published(outcome.pending, published, outcome.swaps), True

    def _not_recorded(self, error: ClaimLost | VersionConflict, pending: PendingVersion) -> None:
        """A version that could not be recorded: its claim was lost, or another version (a
        rollback) came first. Its sessions go back to the queue; a conflict that no rollback
        explains is raised."""
        if isinstance(error, ClaimLost):
            self._lost(error, pending.session_ids)
            return
        with self.db_sessions() as db, db.begin():
            # back to the queue, for a trainer on the latest
            unclaim(db, pending.session_ids, self.instance.id)
        with self.db_sessions() as db:
            if not rolled_back_since(db, self.model_name, pending.claimed_at):
                raise error
        self.log("[train] a rollback moved the model meanwhile: this update is dropped")

    def _discard(self, session_ids: list[str], *, reload: bool) -> None:
        """Drop the update just computed: its sessions go back to the queue, and (`reload`) the
        trainer back to its version's weights and moments."""
        with self.db_sessions() as db, db.begin():
            unclaim(db, session_ids, self.instance.id)
        if reload:
            self._continue_from(self.version)
        self.log("[train] the version this update was built on is not the head: update dropped")

    def _published(
        self, pending: PendingVersion, published: Published, swaps: list[SwapReport]
    ) -> StepReport:
        """The report of a version recorded and pushed (`step_s`: from its claim until every
        backend served it, a background publish included; not the next update it overlapped)."""
        claim, trajectories, samples, skips = pending.report_args
        metrics, clock = pending.metrics, pending.clock
        clock.add_swaps(swaps)  # stage, pause, apply, verify: the slowest backend's
        metrics["phases"] = clock.seconds
        metrics.update(swap_metrics(swaps))
        metrics["step_s"] = (pending.served or time.perf_counter()) - pending.started
        return self._report(published.version, metrics, claim, trajectories, samples, skips, swaps)

    def _report(
        self,
        version: int,
        metrics: dict[str, Any],
        claim: Claim,
        trajectories: list,
        samples: list,
        skips: list,
        swaps: list[SwapReport],
    ) -> StepReport:
        """Note the version's timings on its row, write its run log, print its progress line."""
        self.publisher.note(
            version,
            {
                k: metrics[k]
                for k in ("pause_s", "step_s", "swaps", "hold_s", "transfer_fallbacks", "phases")
                if k in metrics
            },
        )
        self.run_log.write(
            version,
            version_scalars(
                version=version,
                metrics=metrics,
                samples=samples,
                skips=skips,
                outputs=rejected_outputs(trajectories, skips),
                swaps=swaps,
            ),
        )
        report = StepReport(
            version,
            len(claim.session_ids),
            len(samples),
            len(skips),
            len(claim.dropped),
            metrics,
            swaps,
        )
        self.log(self._progress_line(report))
        if "phases" in metrics:
            self.log(phases_line(version, metrics["phases"], metrics.get("step_s", 0.0)))
        return report

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
