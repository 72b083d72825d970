"""Everything a gateway process holds for its lifetime, built in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from rlgw.settings import Settings

if TYPE_CHECKING:  # the services import nothing of the app's wiring: no import circle
    from .auth import AuthService
    from .limits import Limiter
    from .proxy.routing import BackendPool
    from .proxy.service import ProxyService
    from .recording.recorder import Recorder


@dataclass
class GatewayContext:
    settings: Settings
    engine: AsyncEngine
    db_sessions: async_sessionmaker
    http: httpx.AsyncClient
    pool: BackendPool
    recorder: Recorder
    proxy: ProxyService
    auth: AuthService
    limiter: Limiter
