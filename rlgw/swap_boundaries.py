"""Per-token versions of an answer that a weight swap paused and continued in place.

A swap pauses its backend with vLLM's `keep` mode: the requests in flight stay in the engine,
the new weights go in, every running request is preempted (its KV, computed under the old
weights, is dropped) and, on resume, recomputed under the new weights before it samples again.
So each output token was sampled from exactly one version: the first `k` of a request from the
old one, the rest from the new one, and both parts' log-probs are what the record holds.

While paused, the coordinator reads `k` for every request the backend holds (the worker's own
count: rlgw_vllm/generation_state.py) and stores it with the pause (`swap_boundaries`, one row per
pause of a backend, keyed by the epoch the pause began). When the gateway records a completion
that crossed one or more pauses, `resolve` turns them into one version per output token.

Outcomes of a boundary:
    pausing  the epoch was bumped; the counts are not read yet (a recorder waits for them)
    pending  counts read; the new weights are being applied and verified
    served   the new weights passed verification (or the old ones were kept, verified)
    failed   the weights served after the pause failed verification or are unknown: a token
             sampled under them is never trained on

A request key names one choice of one gateway request: the 32 hex digits of its record id and
the choice index (`request_key`); vLLM's internal id of the same choice (`engine_request_key`)
gives the same key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOCK_NAMESPACE = 7_262_002  # pg advisory lock (namespace, backend id): a boundary being written

PAUSING = "pausing"
PENDING = "pending"
SERVED = "served"
FAILED = "failed"
OUTCOMES = (PAUSING, PENDING, SERVED, FAILED)

_HEX = re.compile(r"[0-9a-f]{32}")
_CHOICE_SUFFIX = re.compile(r"-(\d+)$")
_CHILD_PREFIX = re.compile(r"^(\d+)_")


def request_key(record_id: str) -> str | None:
    """The key of a record (choice `i` of a request has id `<reply id>-<i>`, choice 0 the reply
    id itself); None when the id holds no 32-hex request identity."""
    found = _HEX.search(record_id)
    if found is None:
        return None
    suffix = _CHOICE_SUFFIX.fullmatch(record_id[found.end() :])
    return f"{found.group()}:{int(suffix.group(1)) if suffix else 0}"


def engine_request_key(engine_id: str) -> str | None:
    """The key of vLLM's internal request id: `[<i>_]<cmpl-|chatcmpl->`<request_id>`-<random>`,
    `<i>_` for choice i of a request with n > 1 (the gateway sends its reply id as request_id)."""
    found = _HEX.search(engine_id)
    if found is None:
        return None
    child = _CHILD_PREFIX.match(engine_id)
    return f"{found.group()}:{int(child.group(1)) if child else 0}"


@dataclass(frozen=True)
class Boundary:
    """One pause of a backend, as stored."""

    epoch: int
    from_version: int | None
    to_version: int | None
    outcome: str
    running: Mapping[str, int] | None  # request key -> output tokens sampled before it
    finished: frozenset[str]  # request keys finished before it


@dataclass(frozen=True)
class Resolved:
    """The outcome of `resolve`: one version per output token, or why none can be given."""

    versions: list[int] | None
    reason: str | None = None
    unverified: bool = False  # no versions because tokens came from weights that failed

    @property
    def policy_version(self) -> int | None:
        """The version of the first output token: the record's `policy_version`."""
        return self.versions[0] if self.versions else None


def resolve(
    *,
    key: str | None,
    lease_version: int | None,
    lease_epoch: int,
    n_tokens: int,
    boundaries: Sequence[Boundary],
    current_epoch: int,
) -> Resolved:
    """Versions of the `n_tokens` output tokens of the request `key`, leased at `lease_version`
    in `lease_epoch`, given the backend's `boundaries` since (every epoch after `lease_epoch` up
    to `current_epoch` must be there; a missing one leaves the tokens unattributed)."""
    if key is None or lease_version is None:
        return Resolved(None, "the request cannot be matched to the backend's pauses")
    by_epoch = {b.epoch: b for b in boundaries}
    versions: list[int] = []
    version: int | None = lease_version
    unverified = held = False
    for epoch in range(lease_epoch + 1, current_epoch + 1):
        boundary = by_epoch.get(epoch)
        if boundary is None or boundary.outcome == PAUSING or boundary.running is None:
            return Resolved(None, f"the backend's pause at epoch {epoch} recorded no boundary")
        if key in boundary.finished:
            break  # the backend had finished it before this pause: the rest is `version`'s
        before = boundary.running.get(key)
        if before is not None:
            upto = min(int(before), n_tokens)
            if upto < len(versions):
                return Resolved(None, f"the pause at epoch {epoch} counts fewer tokens than before")
            if upto > len(versions) and (version is None or unverified):
                return _UNVERIFIED
            versions += [version] * (upto - len(versions))
            held = True
        elif held:
            # Held before an earlier pause but unknown to this one: it finished in between and
            # fell out of the backend's memory of finished requests. Cannot tell where it ended.
            return Resolved(None, f"the pause at epoch {epoch} does not know the request")
        version, unverified = boundary.to_version, boundary.outcome == FAILED
    if len(versions) < n_tokens:
        if version is None or unverified:
            return _UNVERIFIED
        versions += [version] * (n_tokens - len(versions))
    return Resolved(versions)


_UNVERIFIED = Resolved(
    None, "tokens were sampled under weights that failed verification", unverified=True
)


def runs(versions: Sequence[int]) -> list[tuple[int, int]]:
    """`versions` as (version, count) runs, for logs and tests."""
    out: list[tuple[int, int]] = []
    for v in versions:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out
