"""Training metrics where the field looks for them: one TensorBoard point per policy version
(event files under RLGW_HOME/runs/<model>), and Weights & Biases when asked for and installed.

What is logged (docs/training.md "Metrics" defines each):
- the update: reward, advantages, loss terms, KL, clip fraction, ratio, importance weights;
- the data: staleness of what was trained on, and what was rejected, counted apart from it:
  samples, output tokens and mean recorded log-prob per rejection kind (stale, not eligible,
  pending siblings, ...), so a run that trains on little because it rejects a lot shows it;
- the cost: training, whole-step and pause seconds, and each swap step's seconds and outcomes;
  where the step's time goes, `phase/<name>` per phase and `phase/other` for the rest
  (trainer/loop/phases.py).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .phases import other_seconds

# A rejection reason's kind: the first prefix it starts with (trainer/loop/samples.py's wording).
REJECTION_KINDS: tuple[tuple[str, str], ...] = (
    ("stale:", "stale"),
    ("not eligible", "not_eligible"),
    ("its sibling group is pending", "pending_siblings"),
    ("the session has no normalized return", "no_return"),
    ("served version unknown", "unknown_version"),
    ("longer than", "too_long"),
    ("overlong:", "overlong"),
    ("non-finite", "non_finite"),
    ("zero-variance", "zero_variance"),
)
UPDATE_METRICS = {  # policy_update's metric -> its tag
    "loss": "loss/policy",
    "kl_behave": "policy/kl_behave",
    "clip_frac": "policy/clip_frac",
    "ratio_mean": "policy/ratio_mean",
    "imp_weight_mean": "importance/weight_mean",
    "imp_weight_truncated_frac": "importance/truncated_frac",
    "imp_token_masked_frac": "importance/token_masked_frac",
    "imp_seq_masked_frac": "importance/seq_masked_frac",
    "entropy": "policy/entropy",
    "padding_frac": "time/padding_frac",  # the micro-batches' padding share (packing.py)
    "kl_staleness": "policy/kl_staleness",
    "kl_mismatch": "policy/kl_mismatch",
    "lr": "optim/lr",
    "grad_norm": "policy/grad_norm",
    "reward_mean": "reward/mean",
    "train_s": "time/train_s",
    "step_s": "time/step_s",
    "pause_s": "time/pause_s",
    "hold_s": "time/generation_paused_s",  # colocated: generation out of routing for the update
    "bytes": "swap/bytes",
}


class _Trained(Protocol):
    session_id: str
    completion_id: str
    output_ids: list[int]
    behave_logprobs: list[float]
    advantage: float
    version: int

    @property
    def trained_tokens(self) -> int: ...
    def token_mask(self) -> list[int]: ...
    def trained_versions(self) -> list[int]: ...


class _Rejected(Protocol):
    session_id: str
    completion_id: str
    reason: str


class _Swap(Protocol):
    outcome: str
    steps: dict[str, float]


def rejection_kind(reason: str) -> str:
    for prefix, kind in REJECTION_KINDS:
        if reason.startswith(prefix):
            return kind
    return "other"


def skipped_fractions(
    samples: Sequence[_Trained], skips: Sequence[_Rejected], dropped: Mapping[str, str]
) -> dict[str, float]:
    """The share of the claimed completions not trained on, per rejection kind: a skipped one
    under its reason's kind, every one of a session dropped whole before the update (`dropped`:
    session id -> reason) under that reason's kind. Over the completions of the claim."""
    kinds: Counter[str] = Counter()
    for s in samples:
        if s.session_id in dropped:
            kinds[rejection_kind(dropped[s.session_id])] += 1
    for s in skips:
        kinds[rejection_kind(dropped.get(s.session_id, s.reason))] += 1
    completions = len(samples) + len(skips)
    return {kind: n / completions for kind, n in sorted(kinds.items())} if completions else {}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def version_scalars(
    *,
    version: int,
    metrics: Mapping[str, Any],
    samples: Sequence[_Trained],
    skips: Sequence[_Rejected],
    outputs: Mapping[str, tuple[list[int], list[float]]],
    swaps: Sequence[_Swap] = (),
) -> dict[str, float]:
    """The scalars of one version. `outputs` maps a rejected completion's id to its recorded
    (output token ids, log-probs), so what was rejected is measured like what was trained on."""
    scalars = {tag: float(metrics[key]) for key, tag in UPDATE_METRICS.items() if key in metrics}
    advantages = [s.advantage for s in samples]
    trained_logprobs = [
        lp for s in samples for lp, m in zip(s.behave_logprobs, s.token_mask(), strict=True) if m
    ]
    # behind the weights it updated, by its oldest trained token
    staleness = [version - 1 - min(s.trained_versions(), default=s.version) for s in samples]
    scalars.update(
        {
            "samples/trained": float(len(samples)),
            "tokens/trained": float(sum(s.trained_tokens for s in samples)),
            "logprob/trained_mean": _mean(trained_logprobs),
            "advantage/mean": _mean(advantages),
            "advantage/std": statistics.pstdev(advantages) if advantages else 0.0,
            "advantage/min": min(advantages, default=0.0),
            "advantage/max": max(advantages, default=0.0),
            "staleness/mean": _mean(staleness),
            "staleness/max": float(max(staleness, default=0)),
        }
    )
    by_kind: dict[str, list[_Rejected]] = defaultdict(list)
    for skip in skips:
        by_kind[rejection_kind(skip.reason)].append(skip)
    scalars["samples/rejected"] = float(len(skips))
    for kind, rejected in by_kind.items():
        ids = [outputs.get(r.completion_id, ([], []))[0] for r in rejected]
        logprobs = [lp for r in rejected for lp in outputs.get(r.completion_id, ([], []))[1]]
        scalars[f"rejected/{kind}/samples"] = float(len(rejected))
        scalars[f"rejected/{kind}/tokens"] = float(sum(len(i) for i in ids))
        scalars[f"rejected/{kind}/logprob_mean"] = _mean(logprobs)
    for kind, fraction in (metrics.get("skipped_frac") or {}).items():
        scalars[f"skipped_frac/{kind}"] = float(fraction)
    outcomes = Counter(s.outcome for s in swaps)
    for outcome, count in outcomes.items():
        scalars[f"swap/{outcome}"] = float(count)
    for name in {step for s in swaps for step in s.steps}:
        scalars[f"swap/{name}_s"] = max(s.steps.get(name, 0.0) for s in swaps)
    phases = metrics.get("phases") or {}
    for name, seconds in phases.items():
        scalars[f"phase/{name}"] = float(seconds)
    if phases and "step_s" in metrics:
        scalars["phase/other"] = other_seconds(phases, float(metrics["step_s"]))
    return scalars


class RunLog:
    """Writes each version's scalars to TensorBoard, and to W&B when a project is given.

    A missing package or a W&B run that cannot start is one warning; training goes on."""

    def __init__(
        self,
        log_dir: Path,
        *,
        wandb_project: str | None = None,
        config: Mapping[str, Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.log_dir, self.log = Path(log_dir), log
        self.tensorboard = self._open_tensorboard()
        self.wandb = self._open_wandb(wandb_project, dict(config or {})) if wandb_project else None

    def _open_tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch without the tensorboard package
            self.log(f"[train] warning: no TensorBoard logs ({exc}); pip install tensorboard")
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log(f"[train] TensorBoard: tensorboard --logdir {self.log_dir}")
        return SummaryWriter(str(self.log_dir))

    def _open_wandb(self, project: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            self.log(
                f"[train] warning: --wandb {project} given but wandb is not installed "
                "(pip install wandb); training goes on without it"
            )
            return None
        try:
            return wandb.init(project=project, config=config, dir=str(self.log_dir))
        except Exception as exc:  # an unknown project, no network, no login: warn, go on
            self.log(f"[train] warning: W&B run for project {project!r} did not start: {exc}")
            return None

    def write(self, version: int, scalars: Mapping[str, float]) -> None:
        if self.tensorboard is not None:
            for tag, value in scalars.items():
                self.tensorboard.add_scalar(tag, value, global_step=version)
            self.tensorboard.flush()
        if self.wandb is not None:
            try:
                self.wandb.log(dict(scalars), step=version)
            except Exception as exc:
                self.log(f"[train] warning: W&B logging failed ({exc}); it is turned off")
                self.wandb = None

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def rejected_outputs(
    trajectories: Iterable[Any], skips: Sequence[_Rejected]
) -> dict[str, tuple[list[int], list[float]]]:
    """The recorded output ids and log-probs of each rejected completion, from its trajectory."""
    wanted = {s.completion_id for s in skips}
    return {
        step.completion_id: (step.output_token_ids, step.output_logprobs)
        for t in trajectories
        for step in t.steps
        if step.completion_id in wanted
    }
