"""Admin routes: the stored learning record, read back exactly."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import Field

from rlgw.db.models import Completion
from rlgw.db.token_arrays import unpack_ids, unpack_logprobs
from rlgw.trajectory import OUTPUT_VERSIONS, RecordVerdict, stored_output_versions

from ..deps import AdminDep, DbDep
from ..errors import APIError
from ..ids import COMPLETION_ID_PATTERN

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


class CompletionPublic(RecordVerdict):
    """A stored completion with its token arrays decoded."""

    id: str
    session_id: str
    api: str
    model: str
    prompt_token_ids: list[int] | None
    output_token_ids: list[int]
    output_logprobs: list[float]
    policy_version: int | None = Field(description="the version of its first output token")
    output_versions: list[int] | None = Field(description=OUTPUT_VERSIONS)
    backend: int | None
    finish_reason: str | None
    status: str
    status_reason: str | None
    stream: bool
    latency_ms: float | None
    ttft_ms: float | None
    retry_group: str | None
    sibling_group: str | None
    parent_id: str | None
    request: dict[str, Any]
    response: dict[str, Any] | None
    backend_request: dict[str, Any] | None
    sampling: dict[str, Any] | None = Field(
        description="the sampling settings the backend applied (vLLM's defaults filled in); "
        "null for completions recorded before they were kept"
    )
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, row: Completion) -> CompletionPublic:
        return cls(
            id=row.id,
            session_id=row.session_id,
            api=row.api,
            model=row.model,
            prompt_token_ids=None
            if row.prompt_token_ids is None
            else unpack_ids(row.prompt_token_ids),
            output_token_ids=unpack_ids(row.output_token_ids),
            output_logprobs=unpack_logprobs(row.output_logprobs),
            policy_version=row.policy_version,
            output_versions=stored_output_versions(row),
            backend=row.backend_id,
            finish_reason=row.finish_reason,
            status=row.status,
            status_reason=row.status_reason,
            ineligible_reasons=row.ineligible_reasons,
            stream=row.stream,
            latency_ms=row.latency_ms,
            ttft_ms=row.ttft_ms,
            retry_group=row.retry_group,
            sibling_group=row.sibling_group,
            orphan_reason=row.orphan_reason,
            parent_id=row.parent_id,
            request=row.request,
            response=row.response,
            backend_request=row.backend_request,
            sampling=row.sampling,
            created_at=row.created_at,
            finished_at=row.finished_at,
        )


@router.get("/completions/{completion_id}", response_model=CompletionPublic)
async def read_completion(
    completion_id: Annotated[str, Path(pattern=COMPLETION_ID_PATTERN)], db: DbDep
) -> CompletionPublic:
    row = await db.get(Completion, completion_id)
    if row is None:
        raise APIError(404, f"no completion {completion_id}", code="completion_not_found")
    return CompletionPublic.of(row)
