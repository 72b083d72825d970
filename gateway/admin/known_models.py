"""The check shared by the training-policy endpoints: every model a policy names is registered."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from rlgw.db.models import RegisteredModel

from ..errors import APIError


async def require_registered(db: AsyncSession, models: list[str] | None) -> None:
    """400 `model_not_found` naming every model of `models` that is not registered."""
    if not isinstance(models, list):
        return
    known = set(await db.scalars(select(RegisteredModel.name)))
    unknown = sorted(set(models) - known)
    if unknown:
        raise APIError(
            400, f"no model named {', '.join(unknown)}", code="model_not_found", param="models"
        )
