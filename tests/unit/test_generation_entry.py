"""One helper registers a surface's generation routes: the plain one, its session twin, and
their fast lanes (gateway/generation.py)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel

from gateway.fast_lane import FastLane, install_fast_lanes
from gateway.generation import ENTRY_ATTRIBUTE, GenerationEntry, add_generation_routes


class EchoRequest(BaseModel):
    model: str


ENTRY = GenerationEntry(EchoRequest, check=lambda body, settings: None, surface=lambda body: None)


def app_with(entry: GenerationEntry = ENTRY) -> FastAPI:
    router = APIRouter()
    add_generation_routes(
        router, "/v1/echo", entry, name="echo", summary="Echo", session_summary="Echo in a session"
    )
    app = FastAPI()
    app.include_router(router)
    return app


def test_the_plain_route_and_its_session_twin_are_registered():
    routes = [r for r in app_with().routes if isinstance(r, APIRoute)]
    assert [(r.path, r.name, r.methods, r.summary) for r in routes] == [
        ("/v1/echo", "echo", {"POST"}, "Echo"),
        ("/sessions/{session_id}/v1/echo", "session_echo", {"POST"}, "Echo in a session"),
    ]
    assert all(getattr(r.endpoint, ENTRY_ATTRIBUTE) is ENTRY for r in routes)


def test_the_session_comes_from_the_header_or_the_path():
    paths = app_with().openapi()["paths"]
    plain = paths["/v1/echo"]["post"]
    twin = paths["/sessions/{session_id}/v1/echo"]["post"]
    assert [(p["in"], p["name"]) for p in plain["parameters"]] == [
        ("header", "Idempotency-Key"),
        ("header", "x-session-id"),
    ]
    assert [(p["in"], p["name"]) for p in twin["parameters"]] == [
        ("path", "session_id"),
        ("header", "Idempotency-Key"),
    ]
    for operation in (plain, twin):
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/EchoRequest"}
    assert (plain["operationId"], twin["operationId"]) == (
        "echo_v1_echo_post",
        "session_echo_sessions__session_id__v1_echo_post",
    )


def test_each_route_of_an_entry_gets_a_fast_lane_ahead_of_the_table():
    app = app_with(GenerationEntry(EchoRequest, lambda b, s: None, lambda b: None, anthropic=True))
    install_fast_lanes(app)
    lanes = [r for r in app.router.routes if isinstance(r, FastLane)]
    assert [lane.path for lane in lanes] == ["/v1/echo", "/sessions/{session_id}/v1/echo"]
    assert app.router.routes[: len(lanes)] == lanes
    assert all(lane.anthropic and lane.model is EchoRequest for lane in lanes)
