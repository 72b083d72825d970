"""One completion as the gateway learned it, and the row it is stored as."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rlgw.db.token_arrays import pack_ids, pack_logprobs
from rlgw.eligibility import ineligible_reasons


@dataclass
class CompletionRecord:
    """Everything the gateway learned about one completion, before packing for storage."""

    id: str
    session_id: str
    implicit_session: bool
    api: str
    model: str
    stream: bool
    request: dict[str, Any]
    created_at: datetime
    tenant: str | None = None  # of an implicit session (a named session already has its own)
    agent_key_id: str | None = None  # the agent key of an implicit session (its consent)
    backend_id: int | None = None
    policy_version: int | None = None
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: str = "incomplete"
    status_reason: str | None = None
    response: dict[str, Any] | None = None
    # Responses/Messages: the chat completion body sent to the backend in the request's place.
    backend_request: dict[str, Any] | None = None
    # The sampling settings the backend applied (rlgw.sampling.effective_sampling of its body).
    sampling: dict[str, Any] | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    finished_at: datetime | None = None
    # Lineage: the sequence the request was conditioned on (not stored), and what is derived.
    sequence: Any = None
    retry_group: str | None = None
    sibling_group: str | None = None
    continuation_hash: str | None = None
    continuation_len: int | None = None
    parent_id: str | None = None
    orphan_reason: str | None = None
    # Facts training eligibility depends on besides the evidence (rlgw/eligibility.py): the named
    # session's status when the record was linked into it, and the swap doubt when the request
    # finished (CROSSED_SWAP, or NOT_FOLLOWING until the writer settles it against the registry
    # by comparing `lease_epoch`, the backend's swap epoch when the request was leased).
    session_status: str | None = None
    swap_doubt: str | None = None
    lease_epoch: int | None = None
    # Set when the writer settles a request that a swap paused and continued in place
    # (rlgw/swap_boundaries.py): each output token's version, and the pauses it crossed.
    output_versions: list[int] | None = None
    crossed_epochs: list[int] | None = None
    echo_only: bool = False  # a text completion with `echo` and `max_tokens` 0 (ECHO_ONLY)
    # What row() decided, with the orphan reason (for the metrics of recorded completions).
    verdict: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        reasons = ineligible_reasons(
            status=self.status,
            finish_reason=self.finish_reason,
            policy_version=self.policy_version,
            prompt_token_ids=self.prompt_token_ids,
            output_token_ids=self.output_token_ids,
            output_logprobs=self.output_logprobs,
            session_status=self.session_status,
            swap_doubt=self.swap_doubt,
            echo_only=self.echo_only,
            sampling=self.sampling,
        )
        self.verdict = [*reasons, *([self.orphan_reason] if self.orphan_reason else [])]
        return {
            "id": self.id,
            "session_id": self.session_id,
            "api": self.api,
            "model": self.model,
            "backend_id": self.backend_id,
            "policy_version": self.policy_version,
            "output_versions": self.output_versions,
            "crossed_epochs": self.crossed_epochs,
            "prompt_token_ids": None
            if self.prompt_token_ids is None
            else pack_ids(self.prompt_token_ids),
            "output_token_ids": pack_ids(self.output_token_ids),
            "output_logprobs": pack_logprobs(self.output_logprobs),
            "finish_reason": self.finish_reason,
            "status": self.status,
            "status_reason": self.status_reason,
            "stream": self.stream,
            "latency_ms": self.latency_ms,
            "ttft_ms": self.ttft_ms,
            "request": self.request,
            "response": self.response,
            "backend_request": self.backend_request,
            "sampling": self.sampling,
            "ineligible_reasons": reasons,
            "retry_group": self.retry_group,
            "sibling_group": self.sibling_group,
            "continuation_hash": self.continuation_hash,
            "continuation_len": self.continuation_len,
            "parent_id": self.parent_id,
            "orphan_reason": self.orphan_reason,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }
