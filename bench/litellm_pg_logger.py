"""A Postgres request log for the LiteLLM proxy of bench/gateway_overhead.py (`--litellm-log
postgres`), through LiteLLM's callback API: every successful call's request and response, one
autocommitted INSERT each, run by LiteLLM as it runs its success callbacks (after the answer).

LiteLLM's own request logging (its spend logs, written through Prisma) needs Prisma's query
engine binaries, downloaded from binaries.prisma.sh, which the project's machines cannot reach;
this logger stands in for it so that both gateways record every call. It is loaded by LiteLLM
from its config directory (bench/litellm_proxy.py copies it there); it imports only what the
LiteLLM venv has.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
from litellm.integrations.custom_logger import CustomLogger

DSN_ENV = "RLGW_BENCH_LITELLM_PG"  # its table: bench/litellm_proxy.py's REQUEST_LOG_TABLE
INSERT = (
    "INSERT INTO request_log (call_id, model, request, response, started, ended) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


def _json(value: Any) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return json.dumps(value, default=str)


class PostgresRequestLog(CustomLogger):
    """One connection, opened on first use; psycopg serializes the calls' inserts on it."""

    def __init__(self) -> None:
        super().__init__()
        self._conn: psycopg.AsyncConnection | None = None

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True)
        return self._conn

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time) -> None:
        request = {
            "model": kwargs.get("model"),
            "messages": kwargs.get("messages"),
            "params": kwargs.get("optional_params"),
        }
        conn = await self._connection()
        await conn.execute(
            INSERT,
            (
                kwargs.get("litellm_call_id"),
                kwargs.get("model"),
                _json(request),
                _json(response_obj),
                start_time,
                end_time,
            ),
        )


proxy_handler_instance = PostgresRequestLog()
