"""The swap coordinator: one backend at a time, stage -> pause in place -> apply -> verify -> serve.

    active --pause (keep)--> paused --apply--> verifying --parity ok--> active (new)
                               |                   | parity fails
                               v                   v
                  apply refused/undone      pause -> rollback -> verifying -> active (old)
                                                              \\-> failed (out of routing)

No swap waits for the answers in flight, nor ends them. The pause keeps them in the engine (vLLM's
`keep` mode); while paused, the coordinator stores what each has sampled so far as the pause's
boundary (`boundary.py`, rlgw/swap_boundaries.py); after the apply, every running request is
preempted so that its prefix is recomputed under the new weights, and on resume each one
continues where it stopped: the client sees one uninterrupted answer, and the gateway records
the version of every output token. A request that arrived while paused waits and runs on the new
weights. Tokens sampled under weights that then fail verification are never trained on (the
boundary closes `failed`); a backend left failed and paused ends the requests it still held.

Every state lives in Postgres and is announced with NOTIFY, so every gateway replica stops routing
to the backend before it is paused. The backend only re-enters routing after its served probe
log-probs match the reference forward pass within the backend's own noise band, clearly closer to
the new version's reference than to the old one (`verification.py`: fp32 keeps 1e-4, bf16 is
judged against the noise measured on the backend), and its reported weight version matches the
registry.

The weights themselves move through the weight-update seam (`trainer/weight_update/base.py`):
the plan names the update for each backend (`SwapPlan.update_for`), and the coordinator calls its
stage, apply, verify, commit and rollback at the points shown above, whatever carries them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from rlgw import backend_state as bs
from rlgw import swap_boundaries as sb
from rlgw.db.models import Backend
from rlgw.registry import version_label
from trainer.backends.parity import ProbeScores
from trainer.backends.vllm_control import ControlError, VllmControl
from trainer.weight_update.base import Staged, WeightsUnknown, WeightUpdate

from . import boundary
from .verification import (
    FULL_PRECISION,
    LOW_PRECISION_CEILING,
    NoiseBands,
    judge,
    tolerance_for,
)

ADVISORY_LOCK_NAMESPACE = 7_262_001  # pg_advisory_lock(namespace, backend id): one swap at a time
CONTROL_TIMEOUT_S = 120.0  # longest wait for one control call: a stage is refused after it


@dataclass(frozen=True)
class SwapPlan:
    """One new policy version to install on every backend of a model."""

    model_name: str
    model_id: int
    parent_version: int
    new_version: int
    update: WeightUpdate  # installs new_version (on a backend at parent_version, if relative)
    reference_new: ProbeScores
    reference_old: ProbeScores | None = None  # for verifying a rollback
    fallback: WeightUpdate | None = None  # full weights, for backends not at parent_version
    # Tried first on every backend, where it says it can go (vLLM's native weight transfer);
    # the others get `update_for`. Installs the version from any version, like a fallback.
    preferred: WeightUpdate | None = None
    # The reference scores of any recorded version (rebuilt from its files, so costly: called
    # only to learn the noise of a low-precision backend that serves another version than the
    # parent, e.g. one left behind across a trainer restart). None: the dtype's default noise.
    reference_of: Callable[[int], ProbeScores | None] | None = None

    def __post_init__(self) -> None:
        for extra in (self.fallback, self.preferred):
            if extra is not None and extra.relative:
                raise ValueError(
                    "a plan's fallback and preferred updates must install the version from any "
                    "version"
                )

    def update_for(self, served_version: int | None) -> WeightUpdate | None:
        """The update for a backend serving `served_version`; None when none applies."""
        if not self.update.relative or served_version == self.parent_version:
            return self.update
        return self.fallback

    def choose(
        self, backend: VllmControl, served_version: int | None
    ) -> tuple[WeightUpdate | None, str | None]:
        """The update for this backend, and why the preferred one was passed over (None when
        it was taken, or there is none)."""
        if self.preferred is None:
            return self.update_for(served_version), None
        reason = self.preferred.unusable_on(backend)
        if reason is None:
            return self.preferred, None
        return self.update_for(served_version), f"{self.preferred.kind} not used: {reason}"


@dataclass
class SwapReport:
    backend_id: int
    url: str
    outcome: str = "failed"  # swapped | rolled_back | refused | failed | skipped
    reason: str | None = None
    kind: str | None = None  # what was shipped: the update's kind
    fallback: str | None = None  # why the plan's preferred update was not the one shipped
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step
    paused_s: float = 0.0  # vLLM paused
    out_of_routing_s: float = 0.0  # from leaving routing (the pause, or the stage) to active
    out_of_routing: tuple[float, float] | None = None  # (start, end) on time.monotonic()
    staged_out_of_routing: bool = False  # another backend served while this one staged
    stage_window: tuple[float, float] | None = None  # (start, end) on time.monotonic()
    parity_diff: float | None = None  # max |served - new reference|
    parity_old_diff: float | None = None  # max |served - old reference|
    tolerance: float | None = None  # the band the swap was judged with
    dtype: str | None = None  # the backend's serving dtype
    bytes_shipped: int = 0
    delivery: str | None = None  # how the update travelled, when the backend chose
    pause_epoch: int | None = None  # the backend's epoch of its last pause (its boundary)
    held: int | None = None  # requests the backend held at the pause (None: it could not say)


class SwapFailed(Exception):
    def __init__(self, reason: str, *, leave_paused: bool) -> None:
        super().__init__(reason)
        self.leave_paused = leave_paused


class SwapCoordinator:
    def __init__(
        self,
        engine: Engine,
        *,
        drain_timeout_s: float,
        parity_tolerance: float,
        http: httpx.Client | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.engine = engine
        self.db_sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)
        self.drain_timeout_s = drain_timeout_s
        self.parity_tolerance = parity_tolerance
        self.http = http or httpx.Client(timeout=CONTROL_TIMEOUT_S)
        self.log = log
        self.noise = NoiseBands()  # per backend: dtype and measured probe noise

    # ---------------------------------------------------------------- registry
    def set_state(
        self,
        backend_id: int,
        state: str,
        reason: str | None = None,
        *,
        closing: tuple[int | None, str] | None = None,
        kept_version: int | None = None,
        **kw,
    ) -> None:
        """Change the backend's state; with `closing` (epoch, outcome), close the boundary of
        that pause in the same transaction (`kept_version`: the weights the pause led to, when
        not those it was opened for)."""
        with self.db_sessions() as db, db.begin():
            db.execute(bs.set_state(backend_id, state, reason, **kw))
            if closing is not None and closing[0] is not None:
                self._log_marked(
                    backend_id,
                    boundary.close(db, backend_id, closing[0], closing[1], to_version=kept_version),
                )
            db.execute(bs.NOTIFY, bs.notify_args(backend_id))

    def backends(self, model_id: int) -> list[Backend]:
        with self.db_sessions() as db:
            return list(db.scalars(bs.backends_of(model_id)))

    def _log_marked(self, backend_id: int, marked: list[str]) -> None:
        if marked:
            self.log(
                f"[swap] backend {backend_id}: {len(marked)} completion(s) sampled partly under "
                "weights that failed verification are not trained on"
            )

    # ---------------------------------------------------------------- protocol
    def push(self, plan: SwapPlan) -> list[SwapReport]:
        """Swap every backend of the model, one after another (the others keep serving)."""
        return [self.swap_backend(b, plan) for b in self.backends(plan.model_id)]

    def swap_backend(self, backend: Backend, plan: SwapPlan) -> SwapReport:
        report = SwapReport(backend.id, backend.url)
        with self.engine.connect() as lock_conn:
            locked = lock_conn.execute(
                select(func.pg_try_advisory_lock(ADVISORY_LOCK_NAMESPACE, backend.id))
            ).scalar_one()
            if not locked:
                report.outcome, report.reason = "skipped", "another swap of it is in progress"
                return report
            try:
                self._swap_locked(backend, plan, report)
            finally:
                lock_conn.execute(
                    select(func.pg_advisory_unlock(ADVISORY_LOCK_NAMESPACE, backend.id))
                )
                lock_conn.commit()
        self.log(
            f"[swap] backend {backend.id} {backend.url}: {report.outcome}"
            + (f" ({report.reason})" if report.reason else "")
            + (f" [shipped {report.kind}: {report.fallback}]" if report.fallback else "")
            + "  "
            + "  ".join(f"{k} {v:.3f}s" for k, v in report.steps.items())
        )
        return report

    def _step(self, report: SwapReport, name: str, fn: Callable, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            report.steps[name] = report.steps.get(name, 0.0) + time.perf_counter() - t0

    def _swap_locked(self, backend: Backend, plan: SwapPlan, report: SwapReport) -> None:
        vllm = VllmControl(self.http, backend.url)
        # e.g. an anchor sync instead of a delta; files where the native transfer cannot go
        update, report.fallback = plan.choose(vllm, backend.served_version)
        if update is None:
            report.outcome = "skipped"
            report.reason = (
                f"serves version {backend.served_version}, the {plan.update.kind} applies to "
                f"{plan.parent_version}; no full weights were given"
            )
            return
        report.kind = update.kind
        if not self._know_noise(vllm, update, backend, plan, report):
            return
        # The stage (read, validate, prepare the new weights aside) runs in a thread of the
        # worker while the engine keeps serving, but it competes for the cores. When another
        # backend of the model serves, this one leaves routing first and nobody shares it; a lone
        # backend stages while in routing, and leaves routing only for the pause.
        t_out, mono_out = time.perf_counter(), time.monotonic()
        report.staged_out_of_routing = self._another_serves(backend)
        if report.staged_out_of_routing:
            self.set_state(backend.id, bs.DRAINING, f"staging version {plan.new_version}")
        try:
            mono_stage = time.monotonic()
            update, staged = self._stage(vllm, update, backend, plan, report)
            report.stage_window = (mono_stage, time.monotonic())
        except (ControlError, httpx.HTTPError) as exc:
            report.outcome, report.reason = "refused", f"update refused: {exc}"
            if report.staged_out_of_routing:  # nothing was touched: serve as before
                self.set_state(backend.id, bs.ACTIVE, f"version {plan.new_version} refused: {exc}")
            return
        report.bytes_shipped = staged.nbytes
        if staged.note:
            report.delivery = staged.note
            self.log(f"[swap] backend {backend.id} {backend.url}: {staged.note}")
        if not report.staged_out_of_routing:
            t_out, mono_out = time.perf_counter(), time.monotonic()
        try:
            mode = "keep"
            if update.kind == "lora" and not self._drain(vllm, backend, plan, report):
                mode = "abort"  # what still runs would share the probe's batch: ended
            self._pause(
                vllm,
                backend,
                report,
                reason=f"applying version {plan.new_version}",
                from_version=backend.served_version,
                to_version=_led_to(update, backend, plan),
                mode=mode,
            )
            t_pause = time.perf_counter()
            try:
                self._apply(vllm, update, report)
            finally:
                report.paused_s = time.perf_counter() - t_pause
            self._verify_or_roll_back(vllm, update, backend, plan, report)
        except _Undone as exc:  # the worker kept the old weights: serve them again, verified
            self._serve_old_again(vllm, update, backend, plan, report, str(exc), outcome="refused")
        except SwapFailed as exc:
            report.outcome, report.reason = "failed", str(exc)
            self.set_state(
                backend.id,
                bs.FAILED,
                f"swap to version {plan.new_version} failed: {exc}",
                closing=(report.pause_epoch, sb.FAILED),
            )
            _end_kept_requests(vllm, resume=not exc.leave_paused)
            _label_failed(vllm, plan)
        except (ControlError, httpx.HTTPError, WeightsUnknown) as exc:  # weights unknown
            report.outcome, report.reason = "failed", f"{type(exc).__name__}: {exc}"
            self.set_state(
                backend.id,
                bs.FAILED,
                f"swap to version {plan.new_version} failed, weights unknown: {exc}",
                closing=(report.pause_epoch, sb.FAILED),
            )
            _end_kept_requests(vllm, resume=False)
            _label_failed(vllm, plan)
        finally:
            report.out_of_routing_s = time.perf_counter() - t_out
            report.out_of_routing = (mono_out, time.monotonic())

    def _stage(
        self,
        vllm: VllmControl,
        update: WeightUpdate,
        backend: Backend,
        plan: SwapPlan,
        report: SwapReport,
    ) -> tuple[WeightUpdate, Staged]:
        """Stage `update`; when the plan's preferred update is refused (a stage touches
        nothing), stage the backend's files instead and say why."""
        try:
            return update, self._step(report, "stage", update.stage, vllm)
        except (ControlError, httpx.HTTPError) as exc:
            files = plan.update_for(backend.served_version)
            if update is not plan.preferred or files is None:
                raise
            report.fallback = f"{update.kind} not used: its stage was refused: {exc}"
            report.kind = files.kind
            return files, self._step(report, "stage", files.stage, vllm)

    def _know_noise(
        self,
        vllm: VllmControl,
        update: WeightUpdate,
        backend: Backend,
        plan: SwapPlan,
        report: SwapReport,
    ) -> bool:
        """Learn the backend's dtype and, the first time for a low-precision one, its noise on
        what it serves now (against the old reference). False: refused, nothing touched."""
        try:
            infos = vllm.rpc("rlgw_info")
            dtype = str(infos[0]["dtype"])
        except (ControlError, httpx.HTTPError, LookupError, TypeError):
            dtype = FULL_PRECISION  # a worker that cannot say: judge it by the strictest band
        known = self.noise.learn_dtype(backend.url, dtype)
        report.dtype = dtype
        if dtype == FULL_PRECISION or known.noise is not None:
            return True
        reference = self._served_reference(backend, plan, report)
        if reference is None:
            return True  # nothing to measure against: the dtype's default noise
        noise = self._step(
            report, "measure_noise", update.verify, vllm, plan.model_name, backend.served_version
        ).max_abs_diff(reference)
        if noise > LOW_PRECISION_CEILING:
            report.outcome = "refused"
            report.reason = (
                f"serves version {backend.served_version} {noise:.3g} away from its reference "
                f"on the probe (over the {dtype} ceiling {LOW_PRECISION_CEILING:g}): not swapped"
            )
            return False
        self.noise.record(backend.url, noise)
        return True

    def _served_reference(
        self, backend: Backend, plan: SwapPlan, report: SwapReport
    ) -> ProbeScores | None:
        """The reference scores of the version `backend` serves now, where known."""
        if backend.served_version is None:
            return None
        if backend.served_version == plan.parent_version and plan.reference_old is not None:
            return plan.reference_old
        if plan.reference_of is None:
            return None
        return self._step(report, "served_reference", plan.reference_of, backend.served_version)

    def _tolerance(self, url: str) -> float:
        known = self.noise.get(url)
        if known is None:
            return self.parity_tolerance
        return tolerance_for(known.dtype, known.noise, self.parity_tolerance)

    def _another_serves(self, backend: Backend) -> bool:
        """True when another backend of the same model is in routing now."""
        return any(
            other.id != backend.id and other.state == bs.ACTIVE and other.served_version is not None
            for other in self.backends(backend.model_id)
        )

    def _pause(
        self,
        vllm: VllmControl,
        backend: Backend,
        report: SwapReport,
        *,
        reason: str,
        from_version: int | None,
        to_version: int | None,
        mode: str = "keep",
    ) -> None:
        """Pause the backend in place: out of routing, its requests kept in the engine (`mode`
        "abort": ended instead), and what each has sampled so far stored as the boundary of the
        pause's epoch."""
        with boundary.boundary_lock(self.engine, backend.id):
            epoch = boundary.open_pause(
                self.db_sessions,
                backend.id,
                reason,
                from_version=from_version,
                to_version=to_version,
            )
            report.pause_epoch = epoch
            self._step(report, "pause", vllm.pause, mode)
            state = self._step(report, "boundary", self._generation_state, vllm, backend)
            report.held = boundary.store_counts(self.db_sessions, backend.id, epoch, state)

    def _drain(
        self, vllm: VllmControl, backend: Backend, plan: SwapPlan, report: SwapReport
    ) -> bool:
        """Leave routing and wait (up to the drain timeout) until the backend runs nothing;
        False when requests still run. Only a LoRA swap drains: in the learning benchmark (24
        sessions in flight), vLLM 0.32's CPU LoRA path killed its engine when the parity probe's
        prompt log-probs were batched with the held LoRA requests (`bgmv_shrink`: "einsum():
        subscript b has size 25 ... 54"). A LoRA swap changes no running request's weights (each
        keeps its adapter), so letting them finish first changes no answer."""
        self.set_state(backend.id, bs.DRAINING, f"swap to version {plan.new_version}")
        t0 = time.perf_counter()
        deadline = t0 + self.drain_timeout_s
        idle = False
        while time.perf_counter() < deadline:
            if vllm.requests_in_flight() == 0:
                idle = True
                break
            time.sleep(0.02)
        report.steps["drain"] = time.perf_counter() - t0
        return idle

    def _generation_state(self, vllm: VllmControl, backend: Backend) -> dict | None:
        """The paused backend's requests and their output counts; None when it cannot say
        (then the requests that cross this pause are recorded, but not trained on)."""
        try:
            state = vllm.rpc("rlgw_generation_state")[0]
        except (ControlError, httpx.HTTPError, LookupError) as exc:
            self.log(f"[swap] backend {backend.id}: its requests' counts are unknown ({exc})")
            return None
        if not isinstance(state, dict) or not state.get("tracking"):
            self.log(
                f"[swap] backend {backend.id}: it does not note finished requests (not started "
                "by rlgw backend?): the requests crossing this pause are not trained on"
            )
            return None
        return state

    def _apply(self, vllm: VllmControl, update: WeightUpdate, report: SwapReport) -> None:
        try:
            self._step(report, "apply", update.apply, vllm)
        except ControlError as exc:  # the backend restored the old weights itself
            raise _Undone(str(exc)) from exc
        # Preempt the requests held: their KV was computed under the old weights, so each is
        # recomputed on resume, and every later token is sampled from the new version exactly.
        self._step(report, "reset_cache", vllm.reset_prefix_cache, running=True)
        self._step(report, "resume", vllm.resume)

    def _verify_or_roll_back(
        self,
        vllm: VllmControl,
        update: WeightUpdate,
        backend: Backend,
        plan: SwapPlan,
        report: SwapReport,
    ) -> None:
        self.set_state(backend.id, bs.VERIFYING, f"checking parity of version {plan.new_version}")
        served = self._step(
            report, "parity", update.verify, vllm, plan.model_name, plan.new_version
        )
        verdict = judge(
            served, plan.reference_new, plan.reference_old, tolerance=self._tolerance(backend.url)
        )
        report.parity_diff, report.parity_old_diff = verdict.diff_new, verdict.diff_old
        report.tolerance = verdict.tolerance
        if verdict.accepted:
            self._step(report, "commit", update.commit, vllm)
            self.noise.record(backend.url, verdict.diff_new)
            label = version_label(plan.new_version)
            vllm.set_weight_version(label)
            reported = vllm.weight_version()
            if reported != label:
                raise SwapFailed(
                    f"backend reports weight version {reported!r}, not {label!r}",
                    leave_paused=False,
                )
            self.set_state(
                backend.id,
                bs.ACTIVE,
                None,
                served_version=plan.new_version,
                closing=(report.pause_epoch, sb.SERVED),
            )
            report.outcome = "swapped"
            return
        reason = f"parity failed: {verdict.reason}"
        self._roll_back(vllm, update, backend, plan, report, reason)

    def _roll_back(
        self,
        vllm: VllmControl,
        update: WeightUpdate,
        backend: Backend,
        plan: SwapPlan,
        report: SwapReport,
        reason: str,
    ) -> None:
        # What the new weights sampled while verified is not trained on (a LoRA request kept its
        # old adapter: nothing to mark); the requests still running go back to the old weights.
        if report.pause_epoch is not None:
            outcome = sb.SERVED if update.kind == "lora" else sb.FAILED
            with self.db_sessions() as db, db.begin():
                self._log_marked(
                    backend.id, boundary.close(db, backend.id, report.pause_epoch, outcome)
                )
        self._pause(
            vllm,
            backend,
            report,
            reason=f"rolling back version {plan.new_version}: {reason}",
            from_version=None,
            to_version=backend.served_version,
        )
        try:
            update.rollback(vllm)
        except ControlError as exc:
            raise SwapFailed(f"{reason}; rollback failed: {exc}", leave_paused=True) from exc
        self._serve_old_again(vllm, update, backend, plan, report, reason, outcome="rolled_back")

    def _serve_old_again(
        self,
        vllm: VllmControl,
        update: WeightUpdate,
        backend: Backend,
        plan: SwapPlan,
        report: SwapReport,
        reason: str,
        *,
        outcome: str,
    ) -> None:
        """The old weights are back in place: verify them, then return the backend to routing."""
        vllm.reset_prefix_cache(running=True)
        vllm.resume()
        if plan.reference_old is None:
            raise SwapFailed(
                f"{reason}; no reference to verify the old weights against", leave_paused=True
            )
        old_diff = update.verify(vllm, plan.model_name, backend.served_version).max_abs_diff(
            plan.reference_old
        )
        if old_diff > self._tolerance(backend.url):
            raise SwapFailed(
                f"{reason}; the restored weights fail parity ({old_diff:.3g})", leave_paused=True
            )
        self.noise.record(backend.url, old_diff)
        self.set_state(
            backend.id,
            bs.ACTIVE,
            f"{reason}; kept version {backend.served_version} (verified)",
            closing=(report.pause_epoch, sb.SERVED),
            kept_version=backend.served_version,
        )
        report.outcome, report.reason = outcome, reason


class _Undone(SwapFailed):
    """The worker refused or undid the apply: the old weights are intact."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"apply undone: {reason}", leave_paused=False)


def _led_to(update: WeightUpdate, backend: Backend, plan: SwapPlan) -> int | None:
    """The version a request held by the pause continues on: the new one, except under a LoRA
    update, where a request keeps the adapter it was sent to (the new version is another name)."""
    return backend.served_version if update.kind == "lora" else plan.new_version


def _end_kept_requests(vllm: VllmControl, *, resume: bool) -> None:
    """After a failed swap: resume (the requests held continue, their later tokens not trained
    on), or end them where the backend stays paused (they could never continue)."""
    with contextlib.suppress(ControlError, httpx.HTTPError):  # best effort: it may be gone
        if resume:
            vllm.resume()
        else:
            vllm.pause("abort")


def failed_label(new_version: int) -> str:
    """vLLM's weight label of a backend whose swap failed: it matches no version, so an admin
    resume (which checks the label against the registry) refuses it until weights are pushed."""
    return f"failed-swap-to-{version_label(new_version)}"


def _label_failed(vllm: VllmControl, plan: SwapPlan) -> None:
    with contextlib.suppress(ControlError, httpx.HTTPError):  # best effort: it may be gone
        vllm.set_weight_version(failed_label(plan.new_version))
