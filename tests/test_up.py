"""`rlgw up` as a user types it, with its real process tree (gateway, vLLM, trainer), under each
placement: rewarded traffic trains a version that the backend then serves. Under the shared
placement it also looks after its children: a killed trainer is reported and restarted and trains
on; a killed vLLM is reported and its backend leaves routing."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psycopg
import pytest

from bench.processes import start_server, stop_group

from conftest import ADMIN_KEY, free_port

RLGW = Path(sys.executable).with_name("rlgw")
MODEL = "tiny-seed0"
COLOCATED_WAIT_S = 10.0  # RLGW_COLOCATED_BATCH_WAIT_S under the colocated placement


@dataclass
class Up:
    placement: str
    url: str
    log: Path
    admin: httpx.Client
    db_url: str

    def health(self) -> dict:
        return httpx.get(f"{self.url}/healthz", headers={"X-Admin-Key": ADMIN_KEY}).json()

    def group(self, size: int = 8) -> None:
        """One group of `size` sessions at temperature 1, rewarded 1 and 0 in turn, closed."""
        group = f"g-{uuid.uuid4().hex[:8]}"
        for i in range(size):
            s = self.admin.post("/v1/sessions", json={"group_id": group, "group_size": size})
            session = s.json()
            openai.OpenAI(base_url=session["base_url"], api_key="unused").chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Say A"}],
                max_tokens=6,
                temperature=1.0,
            )
            reward = {"value": float(i % 2)}
            assert self.admin.post(f"/v1/sessions/{session['id']}/rewards", json=reward).is_success
            assert self.admin.post(f"/v1/sessions/{session['id']}/close").is_success

    def served_version(self) -> int | None:
        backends = self.health()["backends"]
        return backends[0]["served_version"] if backends else None


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    raise AssertionError(f"not seen within {timeout_s:.0f}s: {what}\n--- rlgw up ---\n{tail}")


@pytest.fixture(scope="module", params=["shared", "separated", "colocated"])
def up(request, make_database, tmp_path_factory) -> Iterator[Up]:
    placement = request.param
    if placement == "separated" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("separated placement needs 2 CPUs")
    home = tmp_path_factory.mktemp(f"up-{placement}")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGW_")}
    db_url = make_database()
    env.update(
        RLGW_HOME=str(home),
        RLGW_DATABASE_URL=db_url,
        RLGW_AUTH="off",
        RLGW_ADMIN_KEY=ADMIN_KEY,
    )
    argv = [str(RLGW), "up", "--preset", "tiny", "--placement", placement]
    argv += ["--port", str(port), "--backend-port", str(free_port())]
    if placement == "colocated":  # trainer options reach the trainer, from a file and flags
        env["RLGW_COLOCATED_BATCH_WAIT_S"] = str(COLOCATED_WAIT_S)
        (home / "trainer.toml").write_text("lr = 2e-5\nbatch_sessions = 16\n")
        argv += ["--trainer-config", str(home / "trainer.toml"), "--batch-sessions", "8"]
    log = home / "rlgw-up.log"
    proc = start_server(
        argv, env=env, log_path=log, ready_url=f"http://127.0.0.1:{port}/healthz",
        name=f"rlgw up --placement {placement}", timeout_s=420,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    admin = httpx.Client(base_url=url, headers={"X-Admin-Key": ADMIN_KEY}, timeout=120)
    try:
        yield Up(placement, url, log, admin, db_url)
    finally:
        admin.close()
        stop_group(proc, timeout_s=60)


def test_rewarded_traffic_trains_a_version_that_the_backend_serves(up: Up) -> None:
    up.group()
    wait_for("version 1 served", lambda: (up.served_version() or 0) >= 1, 420, up.log)
    versions = up.admin.get("/admin/versions").json()
    config = versions[-1]["metrics"]["config"]
    assert versions[-1]["version"] >= 1
    assert config["batch_sessions"] == (8 if up.placement == "colocated" else 32)  # else default
    assert config["lr"] == (2e-5 if up.placement == "colocated" else 1e-5)  # else the default
    children = up.health()["children"]
    assert children["trainer"]["running"] and children["vllm"]["running"]
    assert children["trainer"]["restarts"] == 0
    # The trainer `rlgw up` started published the version in the background (its `launch`
    # phase), except where generation pauses for updates (colocated: in line, no launch).
    phases: dict = {}

    def noted() -> bool:  # noted on the row once the trainer collects the version
        rows = up.admin.get("/admin/versions").json()
        phases.update(next(r for r in rows if r["version"] == 1)["metrics"].get("phases") or {})
        return bool(phases)

    wait_for("version 1's phases noted", noted, 120, up.log)
    assert ("launch" in phases) == (up.placement != "colocated"), phases
    assert "moments" in phases and phases["forward_backward"] > 0, phases
    # The trainer's swap paused the backend in place and counted what it held: the vLLM that
    # `rlgw up` started notes finished requests (its plugin's hook), so the boundary is whole.
    with psycopg.connect(up.db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        boundaries = conn.execute(
            "SELECT outcome, running IS NOT NULL, finished IS NOT NULL FROM swap_boundaries"
        ).fetchall()
    assert boundaries and all(b == ("served", True, True) for b in boundaries), boundaries


@pytest.mark.parametrize("up", ["colocated"], indirect=True)
def test_a_colocated_trainer_waits_for_a_full_batch_then_trains_a_short_one(up: Up) -> None:
    """Half a batch (4 of 8 sessions) does not pause generation at once: the trainer `rlgw up`
    started waits RLGW_COLOCATED_BATCH_WAIT_S for a full batch, then trains what is there."""
    version = up.served_version() or 0
    up.group(4)  # the group is ready once its last session closes, not before
    ready = time.monotonic()
    wait_for("the short batch served", lambda: (up.served_version() or 0) > version, 420, up.log)
    assert time.monotonic() - ready >= COLOCATED_WAIT_S


@pytest.mark.parametrize("up", ["shared"], indirect=True)
def test_the_learning_record_through_rlgw_up(up: Up) -> None:
    """Through the gateway `rlgw up` runs: a reward outside the configured range is refused and
    nothing is stored; a two-turn session is one training sequence in the training view, the
    first turn (letters only: allowed_token_ids, so context) and the second trained."""
    session = up.admin.post("/v1/sessions", json={}).json()
    sid = session["id"]
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused")
    messages = [{"role": "user", "content": "Say A"}]
    letters = {"allowed_token_ids": list(range(ord("a"), ord("z") + 1))}  # byte ids: re-render
    first = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, extra_body=letters
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Again"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    refused = up.admin.post(f"/v1/sessions/{sid}/rewards", json={"value": 1e300})
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "reward_out_of_range"
    assert up.admin.get(f"/v1/sessions/{sid}/trajectory").json()["return_raw"] is None
    assert up.admin.post(f"/v1/sessions/{sid}/rewards", json={"value": 1.0}).is_success
    view = up.admin.get(f"/v1/sessions/{sid}/trajectory", params={"view": "training"}).json()
    (sequence,) = view["sequences"]
    assert [(t["completion_id"], t["trained"]) for t in sequence["turns"]] == [
        (first.id, False),
        (second.id, True),
    ]
    assert sequence["cuts"] == []


# The children are looked after the same way under every placement: these run under one.
@pytest.mark.parametrize("up", ["shared"], indirect=True)
def test_a_killed_trainer_is_reported_restarted_and_trains_on(up: Up) -> None:
    version = up.served_version() or 0
    os.killpg(up.health()["children"]["trainer"]["pid"], signal.SIGKILL)
    on_console = lambda: "the trainer exited with code" in up.log.read_text()  # noqa: E731
    wait_for("the trainer's exit on the console", on_console, 30, up.log)
    wait_for(
        "the trainer restarted",
        lambda: (t := up.health()["children"]["trainer"])["restarts"] == 1 and t["running"],
        60,
        up.log,
    )
    assert up.health()["children"]["trainer"]["last_exit_code"] == -signal.SIGKILL
    up.group()
    wait_for("the next version served", lambda: (up.served_version() or 0) > version, 420, up.log)


@pytest.mark.parametrize("up", ["shared"], indirect=True)
def test_a_killed_vllm_is_reported_and_its_backend_leaves_routing(up: Up) -> None:
    os.killpg(up.health()["children"]["vllm"]["pid"], signal.SIGKILL)
    wait_for(
        "the backend failed",
        lambda: (
            (h := up.health())["backends"][0]["state"] == "failed"
            and not h["children"]["vllm"]["running"]
        ),
        60,
        up.log,
    )
    assert up.health()["status"] == "degraded"
    (backend,) = up.admin.get("/admin/backends").json()
    assert backend["state_reason"].startswith("the vLLM process of rlgw up exited with code")
    assert "vLLM exited with code" in up.log.read_text()
