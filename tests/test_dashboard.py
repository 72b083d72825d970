"""/dashboard and /dashboard/data: behind the admin key (HTTP Basic for browsers, Bearer,
X-Admin-Key), and in a real headless Chromium the plot and tables show what the database holds."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.registry import register_backend

from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, free_port, gateway_settings

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CHAT = [{"role": "user", "content": "Name a colour."}]
# The trainer's versions (1-3; 0 is the base checkpoint), as policy_versions.metrics holds them.
# Version 2 has no phases (as if recorded before the trainer noted them): it is left out of them.
# No seconds end in a 5 at the third decimal (Python's format and JS's toFixed round ties apart).
VERSIONS = {
    1: {
        "reward_mean": 0.1,
        "pause_s": 0.041,
        "step_s": 2.5,
        "swaps": {"1": "swapped"},
        "phases": {"claim": 0.25, "forward_backward": 1.0, "commit": 0.2, "verify": 0.5},
    },
    2: {"reward_mean": 0.35, "pause_s": 0.052, "step_s": 2.25, "swaps": {"1": "rolled_back"}},
    3: {
        "reward_mean": 0.5,
        "pause_s": 0.047,
        "step_s": 2.75,
        "swaps": {"1": "swapped"},
        "phases": {"claim": 0.5, "load": 0.25, "optimizer": 0.75, "stage": 0.5},
    },
}
# trainer/loop/phases.py's order (tests/unit/test_phases.py checks the page lists the same)
PHASES = (
    "claim", "load", "build", "proximal", "forward_backward", "optimizer", "gather", "delta",
    "launch", "write", "checksum", "commit", "moments", "stage", "pause", "apply", "verify",
)  # fmt: skip
HELD_OUT_REAL = (0.2, 0.6)  # rewards of held-out sessions whose real completions v0 served
HELD_OUT_V2 = 0.9  # the reward of a held-out completion stamped with version 2 (inserted)
SVG_NS = "http://www.w3.org/2000/svg"  # the one URL the page names: SVG's namespace, not a fetch


def basic(key: str, user: str = "admin") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{key}".encode()).decode()}


@dataclass
class Stack:
    url: str
    db_url: str
    backend_id: int
    completion_ids: list[str]  # the real completions, made through the gateway

    def sql(self, query: str, **params) -> list[tuple]:
        engine = create_engine(self.db_url)
        try:
            with engine.begin() as conn:
                result = conn.execute(text(query), params)
                return [tuple(r) for r in result] if result.returns_rows else []
        finally:
            engine.dispose()


def _make_traffic(url: str) -> list[str]:
    """Two held-out sessions and one training session, each with one real completion, rewarded
    and closed."""
    ids = []
    with httpx.Client(base_url=url, timeout=120) as http:
        for name, train, reward in [
            ("held-out-a", False, HELD_OUT_REAL[0]),
            ("held-out-b", False, HELD_OUT_REAL[1]),
            ("training-a", True, 1.0),
        ]:
            assert http.post("/v1/sessions", json={"id": name, "train": train}).status_code == 201
            reply = http.post(
                f"/sessions/{name}/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 4},
            )
            assert reply.status_code == 200, reply.text
            ids.append(reply.json()["id"])
            posted = http.post(f"/v1/sessions/{name}/rewards", json={"value": reward})
            assert posted.status_code in (200, 201), posted.text
            assert http.post(f"/v1/sessions/{name}/close").status_code == 200
    return ids


@pytest.fixture(scope="module")
def stack(make_database: Callable[[], str], vllm_url: str, tiny_model_dir: Path) -> Iterator[Stack]:
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    backend_id = register_backend(
        sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
    )
    engine.dispose()
    with LiveServer(create_app(gateway_settings(db_url)), free_port()) as live:
        stack = Stack(live.url, db_url, backend_id, [])
        stack.completion_ids = _make_traffic(live.url)
        (model_id,) = stack.sql("SELECT id FROM models WHERE name = :n", n=MODEL_NAME)[0]
        stack.sql(
            "UPDATE policy_versions SET created_at = now() - interval '4 minutes' "
            "WHERE model_id = :m AND version = 0",
            m=model_id,
        )
        for version, metrics in VERSIONS.items():
            swaps = {str(backend_id): outcome for outcome in metrics["swaps"].values()}
            stack.sql(
                "INSERT INTO policy_versions (model_id, version, parent_version, kind, metrics, "
                "created_at) VALUES (:m, :v, :p, 'delta', CAST(:metrics AS jsonb), "
                "now() - make_interval(mins => :ago))",
                m=model_id,
                v=version,
                p=version - 1,
                metrics=json.dumps({**metrics, "swaps": swaps}),
                ago=4 - version,
            )
        stack.sql("UPDATE models SET current_version = 3 WHERE id = :m", m=model_id)
        stack.sql(
            "INSERT INTO sessions (id, status, train, closed_at) "
            "VALUES ('held-out-v2', 'closed', false, now())"
        )
        stack.sql(
            "INSERT INTO completions (id, session_id, api, model, policy_version, status, "
            "stream, request, created_at) VALUES ('chatcmpl-v2', 'held-out-v2', "
            "'chat.completions', :model, 2, 'complete', false, '{}', now())",
            model=MODEL_NAME,
        )
        stack.sql(
            "INSERT INTO rewards (session_id, completion_id, value, scope) "
            "VALUES ('held-out-v2', 'chatcmpl-v2', :v, 'completion')",
            v=HELD_OUT_V2,
        )
        yield stack


# ----------------------------------------------------------------------------- auth


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/data"])
def test_without_a_key_the_browser_is_asked_for_one_and_sees_no_data(stack: Stack, path: str):
    reply = httpx.get(stack.url + path)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == 'Basic realm="rlgw"'
    assert reply.json()["error"]["code"] == "missing_admin_key"
    for secret in (MODEL_NAME, "held-out", "reward", "<html"):
        assert secret not in reply.text


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/data"])
def test_a_wrong_basic_password_asks_again(stack: Stack, path: str):
    for headers in (basic("guess-123"), {"Authorization": "Basic !!not-base64!!"}):
        reply = httpx.get(stack.url + path, headers=headers)
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == 'Basic realm="rlgw"'
        assert "guess-123" not in reply.text and MODEL_NAME not in reply.text


@pytest.mark.parametrize(
    "headers",
    [{"X-Admin-Key": "guess-123"}, {"Authorization": "Bearer guess-123"}],
    ids=["x-admin-key", "bearer"],
)
def test_a_wrong_header_key_is_403(stack: Stack, headers):
    reply = httpx.get(stack.url + "/dashboard/data", headers=headers)
    assert reply.status_code == 403
    assert "guess-123" not in reply.text and MODEL_NAME not in reply.text


@pytest.mark.parametrize(
    "headers",
    [
        basic(ADMIN_KEY),
        basic(ADMIN_KEY, user=""),
        {"Authorization": f"Bearer {ADMIN_KEY}"},
        {"X-Admin-Key": ADMIN_KEY},
    ],
    ids=["basic", "basic-no-user", "bearer", "x-admin-key"],
)
def test_the_admin_key_opens_page_and_data(stack: Stack, headers):
    page = httpx.get(stack.url + "/dashboard", headers=headers)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "<script src" not in page.text and "http" not in page.text.replace(SVG_NS, "")
    data = httpx.get(stack.url + "/dashboard/data", headers=headers)
    assert data.status_code == 200 and data.json()["database"]["ok"] is True


def test_data_holds_the_training_and_held_out_rewards(stack: Stack):
    data = httpx.get(stack.url + "/dashboard/data", headers=basic(ADMIN_KEY)).json()
    by_version = {v["version"]: v for v in data["versions"] if v["model"] == MODEL_NAME}
    assert sorted(by_version) == [0, 1, 2, 3]
    assert {v: by_version[v]["reward_mean"] for v in VERSIONS} == {
        v: m["reward_mean"] for v, m in VERSIONS.items()
    }
    assert by_version[0]["held_out_reward_mean"] == pytest.approx(sum(HELD_OUT_REAL) / 2)
    assert by_version[0]["held_out_rewards"] == 2
    assert by_version[2]["held_out_reward_mean"] == pytest.approx(HELD_OUT_V2)
    assert by_version[3]["held_out_reward_mean"] is None
    assert {v: by_version[v]["phases"] for v in (0, 1, 2, 3)} == {
        0: {},
        1: VERSIONS[1]["phases"],
        2: {},
        3: VERSIONS[3]["phases"],
    }
    assert data["trainer_backlog"]["sessions"] == 1  # training-a: closed, rewarded, unconsumed
    assert data["completions"]["eligible"] == len(stack.completion_ids)


# ----------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("chromium or chromedriver missing (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1440,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="rlgw-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    # The driver path is given: Selenium Manager is never asked to download anything.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(check: Callable[[], object], what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.2)
    return result


def rows(driver, table: str) -> list[list[str]]:
    cells = driver.execute_script(
        "return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)]"
        ".map(tr => [...tr.cells].map(td => td.textContent));",
        table,
    )
    return cells


def points(driver, series: str) -> dict[int, float]:
    found = driver.execute_script(
        "return [...document.querySelectorAll(`svg.plot circle.point.${arguments[0]}`)]"
        ".map(c => [c.dataset.version, c.dataset.value]);",
        series,
    )
    return {int(v): float(r) for v, r in found}


def test_the_dashboard_renders_what_the_database_holds(stack: Stack, browser, tmp_path: Path):
    driver = browser
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": basic(ADMIN_KEY)})
    driver.get(stack.url + "/dashboard")
    wait_for(lambda: driver.execute_script("return document.body.dataset.renders"), "a render")

    # The plot: one point per version with a training reward, one per version with held-out ones.
    assert points(driver, "train") == {v: m["reward_mean"] for v, m in VERSIONS.items()}
    held_out = points(driver, "held-out")
    assert held_out.keys() == {0, 2}
    assert held_out[0] == pytest.approx(sum(HELD_OUT_REAL) / 2)
    assert held_out[2] == pytest.approx(HELD_OUT_V2)

    # Versions, newest first, as stored.
    stored = stack.sql(
        "SELECT v.version, v.metrics FROM policy_versions v JOIN models m ON m.id = v.model_id "
        "WHERE m.name = :n ORDER BY v.version DESC",
        n=MODEL_NAME,
    )
    shown = rows(driver, "versions")
    assert [int(r[1]) for r in shown] == [version for version, _ in stored]
    for row, (version, metrics) in zip(shown, stored, strict=True):
        assert row[0] == MODEL_NAME
        if version in VERSIONS:
            assert row[3] == f"{metrics['reward_mean']:.3f}"
            assert row[6] == f"{metrics['pause_s']:.3f}" and row[7] == f"{metrics['step_s']:.3f}"
            assert row[8] == ", ".join(f"{b}: {o}" for b, o in metrics["swaps"].items())
    assert shown[-1][4] == f"{sum(HELD_OUT_REAL) / 2:.3f}" and shown[-1][5] == "2"

    # Where the time goes: the versions with phases, newest first, a column per phase in the
    # trainer's order, `other` = step less the phases, and a bar of them.
    header = driver.execute_script(
        "return [...document.querySelectorAll('#phases thead th')].map(th => th.textContent);"
    )
    assert header == ["model", "version", "step s", *PHASES, "other", ""]
    phases = rows(driver, "phases")
    assert [int(r[1]) for r in phases] == [3, 1]
    for row, version in zip(phases, (3, 1), strict=True):
        metrics = VERSIONS[version]
        assert row[0] == MODEL_NAME and row[2] == f"{metrics['step_s']:.2f}"
        assert row[3 : 3 + len(PHASES)] == [
            f"{metrics['phases'][p]:.2f}" if p in metrics["phases"] else "\u2013" for p in PHASES
        ]
        other = metrics["step_s"] - sum(metrics["phases"].values())
        assert row[3 + len(PHASES)] == f"{other:.2f}"
    bar = driver.execute_script(
        "return [...document.querySelectorAll('#phases tbody tr:first-child rect')]"
        ".map(r => [r.dataset.phase, Number(r.dataset.seconds)]);"
    )
    other = VERSIONS[3]["step_s"] - sum(VERSIONS[3]["phases"].values())
    assert bar == [*[[p, s] for p, s in VERSIONS[3]["phases"].items()], ["other", other]]

    # Backends, with the registry's state and how far behind the current version they are.
    ((backend_id, state, served, current),) = stack.sql(
        "SELECT b.id, b.state, b.served_version, m.current_version FROM backends b "
        "JOIN models m ON m.id = b.model_id"
    )
    ((bid, model, shown_state, _reason, serves, behind, reachable, in_flight),) = rows(
        driver, "backends"
    )
    assert (int(bid), model, shown_state, int(serves), int(behind), reachable) == (
        backend_id, MODEL_NAME, state, served, current - served, "yes",
    )  # fmt: skip
    assert in_flight == "0"

    # Sessions by status, from the database; completions by eligibility, from this process.
    by_status = dict(stack.sql("SELECT status, count(*) FROM sessions GROUP BY status"))
    assert {s: int(n) for s, n in rows(driver, "sessions")} == by_status
    assert rows(driver, "completions") == [["eligible", str(len(stack.completion_ids))]]

    # Nothing was fetched from anywhere but the gateway.
    fetched = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);"
    )
    assert fetched and all(name.startswith(stack.url + "/") for name in fetched), fetched

    shot = tmp_path / "dashboard.png"
    driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("RLGW_UPDATE_DOCS_IMAGES") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "img" / "dashboard.png")


def test_the_dashboard_refreshes_by_itself(stack: Stack, browser):
    driver = browser
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": basic(ADMIN_KEY)})
    driver.get(stack.url + "/dashboard")
    wait_for(lambda: driver.execute_script("return document.body.dataset.renders"), "a render")
    (model_id,) = stack.sql("SELECT id FROM models WHERE name = :n", n=MODEL_NAME)[0]
    stack.sql(
        "INSERT INTO policy_versions (model_id, version, kind, metrics) "
        "VALUES (:m, 4, 'delta', CAST(:metrics AS jsonb))",
        m=model_id,
        metrics=json.dumps({"reward_mean": 0.625, "swaps": {}}),
    )
    try:
        wait_for(lambda: 4 in points(driver, "train"), "version 4 appears without a reload", 20)
        assert points(driver, "train")[4] == 0.625
        assert rows(driver, "versions")[0][1] == "4"
    finally:
        stack.sql("DELETE FROM policy_versions WHERE model_id = :m AND version = 4", m=model_id)
