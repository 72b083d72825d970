"""rlgw_sdk: a small client for RL Gateway's session and reward API.

    from rlgw_sdk import Gateway

    with Gateway("http://127.0.0.1:8000") as gateway:
        with gateway.create_session(task_id="t1") as session:
            client = session.openai()  # an openai.OpenAI bound to the session
            reply = client.chat.completions.create(model="tiny", messages=[...])
            session.reward(1.0, completion_id=reply.id)

See docs/sdk.md.
"""

from ._async_client import AsyncGateway, AsyncSession
from ._base import VERSION as __version__
from ._client import Gateway, Session
from ._exceptions import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    GatewayConnectionError,
    GatewayError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
)
from ._models import CompletionInfo, Reward, SessionInfo

__all__ = [
    "__version__",
    # clients
    "Gateway",
    "AsyncGateway",
    "Session",
    "AsyncSession",
    # results
    "SessionInfo",
    "CompletionInfo",
    "Reward",
    # exceptions
    "GatewayError",
    "GatewayConnectionError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "RateLimitError",
    "ServerError",
]
