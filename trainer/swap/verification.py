"""Whether a backend serves a swap's new version: its probe scores within the backend's own noise
band of the new reference, and clearly closer to the new reference than to the old one.

A backend's noise is max |served - reference| on the probe for weights it is known to serve: an
fp32 server matches the fp32 reference to ~5e-7, a bf16 one to ~2-3e-3, while two versions of the
tiny model differ by ~0.3 (measured on the vLLM CPU build, docs/benchmarks.md). So one fixed
tolerance cannot serve both; each backend is judged against the noise measured on it:

    tolerance   fp32: `parity_tolerance` (1e-4, as before)
                other dtypes: NOISE_FACTOR x the backend's last measured noise, at least
                `parity_tolerance`, at most LOW_PRECISION_CEILING
    accept      d_new <= tolerance                                   (within the band)
                and, when the versions are apart (sep > tolerance),
                d_old - d_new >= MARGIN_FRACTION x sep               (clearly the new one)

with d_new = max |served - new reference|, d_old = max |served - old reference| and
sep = max |new reference - old reference|. Why these numbers:

- NOISE_FACTOR 3: the noise of one bf16 backend varied by less than 1.5x across versions in the
  tests and benchmark here; 3x leaves room for that and is still ~30x below the separation of
  two versions.
- MARGIN_FRACTION 0.5: a correct swap has d_old >= sep - d_new (triangle inequality), so it
  clears the margin whenever d_new <= sep / 4; a swap that changed nothing has d_old - d_new
  ~ -sep and is refused whatever the band. A half-applied one lands somewhere between the two
  versions, where exactly depends on which half: near the middle the margin refuses it, nearer
  the new version the band does (the tiny model with every other tensor: d_new 2.5e-2 against a
  bf16 band of 6.4e-3, d_old 0.17). Below sep = tolerance the probe cannot tell the versions
  apart and the band alone decides (a step too small to see on the probe).
- LOW_PRECISION_CEILING 0.1: the band follows the last measurement, so without a cap a slowly
  drifting backend could widen it swap after swap. The noise grows with depth: 2-3e-3 for the
  tiny model (2 layers) in bf16, 2.9e-2 for bench-0.5b (24 layers), whose band is then 0.087;
  two versions of bench-0.5b in the benchmark are 1.78 apart.

The noise is kept by the trainer, per backend (`NoiseBands`, in the swap coordinator): measured
when the coordinator first meets a backend, against the reference of the version it serves (the
update's parent; for a backend behind, that version rebuilt from its files; it is not stored in the
database: the backends table has no column for it and this change adds no migration), and again
after every verified swap or rollback.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.backends.parity import ProbeScores

FULL_PRECISION = "float32"
NOISE_FACTOR = 3.0
MARGIN_FRACTION = 0.5
LOW_PRECISION_CEILING = 0.1
# A low-precision backend whose noise could not be measured (it serves no recorded version, or
# one whose files are gone): the bf16 noise of the tiny model measured on this machine kind. A
# deeper model's noise is larger (bench-0.5b: 2.9e-2), so such a backend's first swap may be
# refused (never wrongly accepted).
DEFAULT_LOW_PRECISION_NOISE = 3e-3


@dataclass(frozen=True)
class Verdict:
    """The outcome of comparing served probe scores with the new and old references."""

    accepted: bool
    diff_new: float  # max |served - new reference|
    tolerance: float
    diff_old: float | None = None  # max |served - old reference| (None: no old reference)
    separation: float | None = None  # max |new reference - old reference|
    reason: str | None = None  # why it was refused


@dataclass
class BackendNoise:
    """What the trainer knows of one backend's serving precision."""

    dtype: str  # "float32", "bfloat16", ... as the worker reports it
    noise: float | None = None  # last measured max |served - reference| on the probe


def tolerance_for(dtype: str, noise: float | None, parity_tolerance: float) -> float:
    """The largest d_new accepted on a backend serving in `dtype` with measured `noise`."""
    if dtype == FULL_PRECISION:
        return parity_tolerance
    measured = DEFAULT_LOW_PRECISION_NOISE if noise is None else noise
    return min(LOW_PRECISION_CEILING, max(parity_tolerance, NOISE_FACTOR * measured))


def judge(
    served: ProbeScores,
    new: ProbeScores,
    old: ProbeScores | None,
    *,
    tolerance: float,
) -> Verdict:
    """Accept the served scores as the new version's (the rule in this module's docstring)."""
    diff_new = served.max_abs_diff(new)
    if old is None:
        if diff_new <= tolerance:
            return Verdict(True, diff_new, tolerance)
        return Verdict(False, diff_new, tolerance, reason=_band(diff_new, tolerance))
    diff_old = served.max_abs_diff(old)
    separation = new.max_abs_diff(old)
    verdict = Verdict(True, diff_new, tolerance, diff_old, separation)
    if diff_new > tolerance:
        return _refused(verdict, _band(diff_new, tolerance))
    margin = MARGIN_FRACTION * separation
    if separation > tolerance and diff_old - diff_new < margin:
        return _refused(
            verdict,
            f"not clearly the new version: |served - old| - |served - new| = "
            f"{diff_old - diff_new:.3g} < {MARGIN_FRACTION:g} x {separation:.3g} "
            f"(the versions' distance on the probe)",
        )
    return verdict


def _band(diff_new: float, tolerance: float) -> str:
    return f"max |served - reference| = {diff_new:.3g} > {tolerance:g}"


def _refused(verdict: Verdict, reason: str) -> Verdict:
    return Verdict(
        False, verdict.diff_new, verdict.tolerance, verdict.diff_old, verdict.separation, reason
    )


class NoiseBands:
    """Per backend URL: its serving dtype and last measured noise (kept for the trainer's life)."""

    def __init__(self) -> None:
        self._known: dict[str, BackendNoise] = {}

    def get(self, url: str) -> BackendNoise | None:
        return self._known.get(url)

    def learn_dtype(self, url: str, dtype: str) -> BackendNoise:
        known = self._known.get(url)
        if known is None or known.dtype != dtype:  # a restarted backend may serve another dtype
            known = self._known[url] = BackendNoise(dtype)
        return known

    def record(self, url: str, noise: float) -> None:
        known = self._known.get(url)
        if known is not None:
            known.noise = noise
