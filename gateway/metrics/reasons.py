"""Why a recorded completion may not be trained on, reduced to a bounded kind for metric labels.

Every reason carries its kind from where it is decided (a `rlgw.eligibility.Reason`: made in
rlgw/eligibility.py, and in gateway/recording/lineage.py for orphans); a text made without one is
`other`, so a new wording can never add a label value. No kind is read back from wording."""

from __future__ import annotations

from rlgw.eligibility import ReasonKind, kind_of

KINDS = tuple(ReasonKind)  # `other` last


def reason_kind(reason: str) -> ReasonKind:
    """The kind of one ineligibility reason (`other` for a text made without one)."""
    return kind_of(reason)
