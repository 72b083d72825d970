"""No route of the gateway runs a dependency in the thread pool: a plain `def` dependency costs
each request a hop to a worker thread and back (FastAPI's run_in_threadpool)."""

from __future__ import annotations

import inspect

from fastapi.routing import APIRoute

from gateway.main import create_app
from rlgw.settings import Settings


def _is_async(call) -> bool:
    return (
        inspect.iscoroutinefunction(call)
        or inspect.iscoroutinefunction(
            getattr(call, "__call__", None)  # noqa: B004 - a security scheme is an async callable
        )
        or inspect.isasyncgenfunction(call)
    )


def _sync_dependencies(dependant, seen: list[str]) -> list[str]:
    for dep in dependant.dependencies:
        if dep.call is not None and not _is_async(dep.call):
            seen.append(getattr(dep.call, "__qualname__", repr(dep.call)))
        _sync_dependencies(dep, seen)
    return seen


def test_every_dependency_is_a_coroutine() -> None:
    app = create_app(Settings(database_url="postgresql://unused@127.0.0.1:1/unused", auth="off"))
    found = {
        route.path: _sync_dependencies(route.dependant, [])
        for route in app.routes
        if isinstance(route, APIRoute)
    }
    assert {path: deps for path, deps in found.items() if deps} == {}
    assert "/v1/chat/completions" in found
