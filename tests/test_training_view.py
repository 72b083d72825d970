"""The training view (`GET /v1/sessions/{id}/trajectory?view=training`, `rlgw export --view
training`): the sequences the trainer builds from a session, read from real Postgres rows.

Sessions, completions, rewards and versions are rows written here directly (as in
tests/test_claims.py), their token ids laid out as SmolLM2's chat template renders a conversation
(<|im_start|> 1, <|im_end|> 2, a newline 198), so that each case is exactly the record shape it
names. Postgres only: the HTTP tests run a gateway on a fake upstream (tests/fakes.py), no vLLM.
Each test registers models of its own names, so that one database serves the module.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import create_engine, text, update
from sqlalchemy.orm import Session

from gateway.main import create_app
from rlgw.db.models import (
    AgentSession,
    Completion,
    PolicyVersion,
    RegisteredModel,
    Reward,
    SessionGroup,
)
from rlgw.db.token_arrays import pack_ids, pack_logprobs
from rlgw.export import export_command
from rlgw.sequences import DEFAULT_LIMITS
from rlgw.training_view import TrainingView, load_training_view
from rlgw.trajectory import load_trajectory
from rlgw.version_lineage import lineage
from rlgw_cli import main
from trainer.config import TrainerConfig
from trainer.loop.samples import build_samples, row_tokens, sequence_rows

from auth_helpers import as_key, auth_gateway, mint_key
from conftest import ADMIN_KEY, LiveServer, free_port, gateway_settings
from fakes import fake_backend_database, vllm_like

IM_START, IM_END, NL = 1, 2, 198
SYSTEM, USER, ASSISTANT = 9690, 4093, 520
T0 = datetime(2026, 3, 1, tzinfo=UTC)
_clock = itertools.count()


def message(role: int, text: list[int]) -> list[int]:
    return [IM_START, role, NL, *text, IM_END, NL]


def answer(text: list[int]) -> list[int]:
    """A model's output: its text, then <|im_end|> (the template's newline follows in context)."""
    return [*text, IM_END]


GENERATE = [IM_START, ASSISTANT, NL]  # the generation prompt
SYSTEM_MSG = message(SYSTEM, [2683, 359, 253, 5356, 5646, 30])
P1 = SYSTEM_MSG + message(USER, [1780, 314, 216, 34, 1232, 216, 34, 47]) + GENERATE
O1 = answer([504, 3575, 314, 216, 36, 30])
P2 = P1 + O1 + [NL] + message(USER, [9286, 253, 1759, 30]) + GENERATE
O2 = answer([1319, 3575, 28, 2060, 30])
P3 = P2 + O2 + [NL] + message(USER, [13359, 30]) + GENERATE
O3 = answer([7576, 17, 216, 38, 30])


@pytest.fixture(scope="module")
def db_url(make_database: Callable[[], str]) -> str:
    url = fake_backend_database(make_database)
    engine = create_engine(url)
    with engine.begin() as conn:  # it inserts model id 1 by hand: move the id sequence past it
        conn.execute(text("SELECT setval(pg_get_serial_sequence('models', 'id'), 1)"))
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def engine(db_url: str) -> Iterator:
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


def tick() -> datetime:
    """Strictly increasing timestamps: the record's order of what a test creates."""
    return T0 + timedelta(seconds=next(_clock))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def register(
    db: Session, *, head: int = 0, config: dict | None = None, rejected: tuple[int, ...] = ()
) -> str:
    """A model of a fresh name whose versions 1..head each build on the one before (`config`
    recorded in the head's metrics, as the trainer records it); `rejected` versions branch off
    the head and are not on its lineage."""
    name = new_id("m")
    model = RegisteredModel(name=name, current_version=head)
    db.add(model)
    db.flush()
    for v in range(head + 1):
        metrics = {"config": config} if v == head and config is not None else {}
        kind = "base" if v == 0 else "delta"
        parent = v - 1 if v else None
        db.add(
            PolicyVersion(
                model_id=model.id, version=v, parent_version=parent, kind=kind, metrics=metrics
            )
        )
    for v in rejected:
        db.add(
            PolicyVersion(
                model_id=model.id, version=v, parent_version=head, kind="delta", status="rejected"
            )
        )
    db.flush()
    return name


def new_session(db: Session, *, status: str = "closed", tenant: str | None = None) -> str:
    sid = new_id("s")
    at = tick()
    db.add(AgentSession(id=sid, status=status, tenant=tenant, created_at=at, closed_at=at))
    db.flush()
    return sid


def completion(
    db: Session,
    sid: str,
    model: str,
    prompt: list[int],
    output: list[int],
    *,
    version: int = 0,
    sibling_group: str | None = None,
    orphan_reason: str | None = None,
    finish_reason: str = "stop",
    cid: str | None = None,
    output_versions: list[int] | None = None,
) -> str:
    cid = cid or new_id("c")
    db.add(
        Completion(
            id=cid,
            session_id=sid,
            api="chat.completions",
            model=model,
            policy_version=version,
            output_versions=output_versions,
            prompt_token_ids=pack_ids(prompt),
            output_token_ids=pack_ids(output),
            # exact in float32: the record stores log-probs as float32
            output_logprobs=pack_logprobs([-0.25 * (i % 4 + 1) for i in range(len(output))]),
            finish_reason=finish_reason,
            status="complete",
            stream=False,
            request={},
            sibling_group=sibling_group,
            orphan_reason=orphan_reason,
            created_at=tick(),
        )
    )
    db.flush()
    return cid


def reward(db: Session, sid: str, value: float, completion_id: str | None = None) -> None:
    scope = "session" if completion_id is None else "completion"
    db.add(Reward(session_id=sid, value=value, scope=scope, completion_id=completion_id))
    db.flush()


def view_of(engine, sid: str) -> TrainingView:
    with Session(engine) as db:
        view = load_training_view(db, sid, datetime.now(UTC))
    assert view is not None
    return view


def three_turns(db: Session, model: str, **session) -> tuple[str, list[str]]:
    """A rewarded session of three turns, each prompt the last prompt and output and more."""
    sid = new_session(db, **session)
    ids = [completion(db, sid, model, p, o) for p, o in ((P1, O1), (P2, O2), (P3, O3))]
    reward(db, sid, 1.0)
    return sid, ids


def output_mask(length: int, spans: list[tuple[int, int]]) -> list[int]:
    return [int(any(a <= i < b for a, b in spans)) for i in range(length)]


# ----------------------------------------------------------------------------- the sequences


def test_three_turns_that_extend_each_other_are_one_sequence_trained_on_each_output(engine):
    with Session(engine) as db, db.begin():
        model = register(db)
        sid, ids = three_turns(db, model)
    view = view_of(engine, sid)
    (seq,) = view.sequences
    spans = [
        (len(P1), len(P1) + len(O1)),
        (len(P2), len(P2) + len(O2)),
        (len(P3), len(P3) + len(O3)),
    ]
    assert seq.token_ids == P3 + O3  # the last prompt and output hold every earlier turn
    assert seq.loss_mask == output_mask(len(P3 + O3), spans)
    assert [(t.completion_id, t.start, t.end, t.trained) for t in seq.turns] == [
        (cid, a, b, True) for cid, (a, b) in zip(ids, spans, strict=True)
    ]
    assert seq.cuts == [] and seq.trains and seq.model == model
    assert seq.update_length == len(seq.token_ids)  # its last turn trains
    # recorded log-probs and versions on outputs, nothing on context; the return as advantage
    assert seq.logprobs[len(P1) : len(P1) + 2] == [-0.25, -0.5]
    assert [x is None for x in seq.logprobs] == [not m for m in seq.loss_mask]
    assert all(v == 0 if m else v is None for v, m in zip(seq.versions, seq.loss_mask, strict=True))
    assert seq.advantages == [float(m) for m in seq.loss_mask]
    assert len(seq.logprobs) == len(seq.versions) == len(seq.advantages) == len(seq.token_ids)
    assert view.left_out == []
    (m,) = view.models
    assert (m.model, m.current_version, m.limits_source, m.advantage_source) == (
        model,
        0,
        "default",
        "trajectory",
    )
    assert m.limits.model_dump() == {
        "max_staleness": DEFAULT_LIMITS.max_staleness,
        "max_tokens_per_sample": DEFAULT_LIMITS.max_tokens_per_sample,
        "overlong": DEFAULT_LIMITS.overlong,
        "overlong_penalty": DEFAULT_LIMITS.overlong_penalty,
        "join_turns": DEFAULT_LIMITS.join_turns,
    }


def test_the_choices_of_a_request_with_n_2_are_a_branch(engine):
    other = answer([504, 1849, 28, 2060, 30])
    with Session(engine) as db, db.begin():
        model = register(db)
        sid = new_session(db)
        first = new_id("c")  # a sibling group is named after its choice 0
        completion(db, sid, model, P1, O1, sibling_group=first, cid=first)
        second = completion(db, sid, model, P1, other, sibling_group=first)
        reward(db, sid, 1.0, first)
        reward(db, sid, 0.0, second)
    one, two = view_of(engine, sid).sequences
    assert (one.token_ids, two.token_ids) == (P1 + O1, P1 + other)
    assert one.cuts == []
    assert [(c.at, c.reason) for c in two.cuts] == [(second, "branch")]
    assert first in two.cuts[0].detail  # the history before the first choice's output
    # each choice trains on its reward normalized within the sibling group
    assert one.trains and two.trains
    assert one.turns[0].advantage > 0 > two.turns[0].advantage


def test_an_edited_history_is_cut_as_history_edited(engine):
    edited = message(SYSTEM, [2683, 359, 253, 11343, 5646, 30])  # one word of the system prompt
    with Session(engine) as db, db.begin():
        model = register(db)
        sid = new_session(db)
        completion(db, sid, model, P1, O1)
        later = completion(db, sid, model, edited + P2[len(SYSTEM_MSG) :], O2)
        reward(db, sid, 1.0)
    one, two = view_of(engine, sid).sequences
    assert [t.completion_id for t in two.turns] == [later]
    assert [(c.at, c.reason) for c in two.cuts] == [(later, "history_edited")]
    assert f"at token {SYSTEM_MSG.index(5356)}" in two.cuts[0].detail  # where the word changed
    assert one.trains and two.trains


def test_an_earlier_answer_rendered_differently_is_cut_as_output_retokenized(engine):
    # the same text, tokenized differently once the template re-renders it (" 4" as two ids)
    retokenized = answer([504, 3575, 314, 216, 1232, 36, 30])
    with Session(engine) as db, db.begin():
        model = register(db)
        sid = new_session(db)
        first = completion(db, sid, model, P1, O1)
        later = completion(db, sid, model, P1 + retokenized + P2[len(P1) + len(O1) :], O2)
        reward(db, sid, 1.0)
    one, two = view_of(engine, sid).sequences
    assert [(c.at, c.reason) for c in two.cuts] == [(later, "output_retokenized")]
    assert f"inside {first}'s output (token 4 of it)" in two.cuts[0].detail
    assert one.trains and two.trains  # both train, each in its own sequence


def test_a_retry_orphan_never_appears(engine):
    with Session(engine) as db, db.begin():
        model = register(db)
        sid = new_session(db)
        orphan = completion(db, sid, model, P1, O1, orphan_reason="superseded by a retry")
        kept = completion(db, sid, model, P1, O1)
        after = completion(db, sid, model, P2, O2)
        reward(db, sid, 1.0)
    view = view_of(engine, sid)
    listed = [t.completion_id for s in view.sequences for t in s.turns]
    listed += [x.completion_id for x in view.left_out]
    assert orphan not in listed and listed == [kept, after]
    # seen, the orphan would have made the retry a branch of its own sequence
    (seq,) = view.sequences
    assert seq.cuts == [] and seq.token_ids == P2 + O2


def test_each_models_sequences_hold_only_its_own_turns(engine):
    plan_prompt = SYSTEM_MSG + message(USER, [6245, 253, 2007]) + GENERATE
    plan = answer([33, 30, 5098, 260])
    plan_prompt2 = plan_prompt + plan + [NL] + message(USER, [11101, 30]) + GENERATE
    with Session(engine) as db, db.begin():
        worker, planner = register(db), register(db, head=3)
        sid = new_session(db)
        p1 = completion(db, sid, planner, plan_prompt, plan, version=3)
        w1 = completion(db, sid, worker, P1, O1)
        p2 = completion(db, sid, planner, plan_prompt2, answer([1449, 30]), version=3)
        w2 = completion(db, sid, worker, P2, O2)
        reward(db, sid, 1.0)
    view = view_of(engine, sid)
    assert [(m.model, m.current_version) for m in view.models] == [(planner, 3), (worker, 0)]
    by_model = {s.model: s for s in view.sequences}
    assert len(view.sequences) == 2  # one each: the other model's turns cut neither
    assert [t.completion_id for t in by_model[planner].turns] == [p1, p2]
    assert [t.completion_id for t in by_model[worker].turns] == [w1, w2]
    assert by_model[planner].cuts == by_model[worker].cuts == []
    assert by_model[planner].versions[len(plan_prompt)] == 3


def test_a_model_that_is_not_registered_is_viewed_at_version_0_with_the_defaults(engine):
    unregistered = new_id("gone")  # e.g. a model removed since its sessions were recorded
    with Session(engine) as db, db.begin():
        sid = new_session(db)
        first = completion(db, sid, unregistered, P1, O1)
        later = completion(db, sid, unregistered, P2, O2, version=2)
        reward(db, sid, 1.0)
    view = view_of(engine, sid)
    (m,) = view.models
    assert (m.model, m.current_version, m.limits_source) == (unregistered, 0, "default")
    (seq,) = view.sequences
    assert [(t.completion_id, t.trained) for t in seq.turns] == [(first, True), (later, False)]
    assert "not an ancestor of version 0" in seq.turns[1].reason  # no version 2 on record


@pytest.mark.parametrize("status", ["open", "closed", "claimed", "consumed"])
def test_the_view_is_served_in_every_session_status(engine, status):
    with Session(engine) as db, db.begin():
        model = register(db)
        sid, ids = three_turns(db, model, status=status)
        if status == "claimed":
            db.execute(update(AgentSession).where(AgentSession.id == sid).values(claimed_by=7))
    view = view_of(engine, sid)
    assert view.status == status
    (seq,) = view.sequences
    assert [t.completion_id for t in seq.turns if t.trained] == ids


def test_a_turn_longer_than_the_recorded_cap_is_left_out_and_the_config_is_read(engine):
    """The head version recorded max_tokens_per_sample 40 and the rloo baseline; fields it did
    not record take the defaults."""
    config = {"max_tokens_per_sample": 40, "baseline": "rloo", "singleton_baseline": "none"}
    assert len(P1 + O1) <= 40 < len(P2 + O2)
    with Session(engine) as db, db.begin():
        model = register(db, head=1, config=config)
        sid = new_session(db)
        first = completion(db, sid, model, P1, O1, version=1)
        long = completion(db, sid, model, P2, O2, version=1)
        reward(db, sid, 1.0)
    view = view_of(engine, sid)
    assert [(x.completion_id, x.model, x.reason) for x in view.left_out] == [
        (long, model, "longer than 40 tokens")
    ]
    (seq,) = view.sequences
    assert [t.completion_id for t in seq.turns] == [first] and seq.token_ids == P1 + O1
    (m,) = view.models
    assert m.limits.max_tokens_per_sample == 40 and m.limits_source == "version"
    assert m.limits.max_staleness == DEFAULT_LIMITS.max_staleness  # not recorded: the default
    assert m.advantage_source == "batch" and "rloo" in m.advantage_note


def test_a_recorded_join_turns_false_makes_every_turn_a_sequence_of_its_own(engine):
    with Session(engine) as db, db.begin():
        model = register(db, head=1, config=TrainerConfig(join_turns=False).as_dict())
        sid, ids = three_turns(db, model)
    view = view_of(engine, sid)
    assert [s.token_ids for s in view.sequences] == [P1 + O1, P2 + O2, P3 + O3]
    assert [[t.completion_id for t in s.turns] for s in view.sequences] == [[i] for i in ids]
    assert all(s.cuts == [] for s in view.sequences)  # not cut: never joined
    assert view.models[0].limits.join_turns is False


def test_the_views_sequences_are_the_trainers_samples(engine):
    """The same trajectory, version, lineage and limits give the same rows in build_samples:
    the same trained completions per sequence, its token ids up to update_length (a sequence
    whose last turns do not train is forwarded up to its last trained output), the same
    reasons for the rest."""
    config = TrainerConfig(max_staleness=1, overlong="mask")
    with Session(engine) as db, db.begin():
        model = register(db, head=2, config=config.as_dict(), rejected=(3,))
        sid = new_session(db)
        stale = completion(db, sid, model, P1, O1, version=0)  # 2 behind, bound 1: context
        trained = completion(db, sid, model, P2, O2, version=1)
        cut = completion(db, sid, model, P3, O3, version=2, finish_reason="length")  # masked
        regenerated = completion(db, sid, model, P3, answer([7576, 17, 30]), version=2)
        off_lineage = completion(db, sid, model, P2, answer([2060, 30]), version=3)
        reward(db, sid, 1.0)
    view = view_of(engine, sid)
    with Session(engine) as db:
        trajectory = load_trajectory(db, sid, datetime.now(UTC))
        model_id = db.query(RegisteredModel.id).filter_by(name=model).scalar()
        depths = lineage(db, model_id, 2)
    samples, skips = build_samples(
        [trajectory], current_version=2, config=config, lineage=depths, model=model
    )
    rows = [(row_tokens(r), [s.completion_id for s in r]) for r in sequence_rows(samples)]
    shown = [
        (s.token_ids[: s.update_length], [t.completion_id for t in s.turns if t.trained])
        for s in view.sequences
        if s.trains
    ]
    assert shown == rows
    first = view.sequences[0]  # stale, trained, masked: forwarded up to the trained output
    assert first.update_length == len(P2 + O2) < len(first.token_ids) == len(P3 + O3)
    assert {t.completion_id for s in view.sequences for t in s.turns if t.trained} == {
        trained,
        regenerated,
    }
    not_trained = {t.completion_id: t.reason for s in view.sequences for t in s.turns}
    not_trained = {k: v for k, v in not_trained.items() if v is not None}
    assert not_trained == {k.completion_id: k.reason for k in skips}
    assert set(not_trained) == {stale, cut, off_lineage}
    assert not_trained[stale].startswith("stale")
    advantages = {t.completion_id: t.advantage for s in view.sequences for t in s.turns}
    assert all(advantages[s.completion_id] == s.advantage for s in samples)


# ------------------------------------------------------------------- per-token versions
# A weight swap paused a request in place and continued it on new weights (rlgw/sequences.py).


def test_a_turn_a_swap_continued_shows_each_tokens_version_and_trains_the_fresh_ones(engine):
    config = TrainerConfig(max_staleness=2)
    crossed = [2, 2, 2, 5, 5, 5, 5]  # O1's 7 tokens: 3 at version 2 (3 behind: stale), 4 at 5
    with Session(engine) as db, db.begin():
        model = register(db, head=5, config=config.as_dict())
        sid = new_session(db)
        first = completion(db, sid, model, P1, O1, version=2, output_versions=crossed)
        second = completion(db, sid, model, P2, O2, version=5)  # column null: all at 5
        reward(db, sid, 1.0)
    with Session(engine) as db:
        steps = load_trajectory(db, sid, datetime.now(UTC)).steps
    assert [s.output_versions for s in steps] == [crossed, [5] * len(O2)]
    (seq,) = view_of(engine, sid).sequences
    out1 = slice(len(P1), len(P1) + len(O1))
    assert seq.versions[out1] == crossed
    assert seq.loss_mask[out1] == [0, 0, 0, 1, 1, 1, 1]
    assert seq.advantages[out1] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert seq.versions[len(P2) :] == [5] * len(O2) and all(seq.loss_mask[len(P2) :])
    turn1, turn2 = seq.turns
    assert (turn1.completion_id, turn1.trained, turn1.policy_version) == (first, True, 2)
    assert turn1.masked_reason == (
        "3 of 7 output tokens carry no loss: stale: generated by version 2, 3 behind (bound 2)"
    )
    assert (turn2.completion_id, turn2.masked_reason) == (second, None)


def test_a_completion_of_unknown_version_has_no_output_versions(engine):
    with Session(engine) as db, db.begin():
        model = register(db)
        sid = new_session(db)
        cid = completion(db, sid, model, P1, O1)
        db.execute(update(Completion).where(Completion.id == cid).values(policy_version=None))
    with Session(engine) as db:
        (step,) = load_trajectory(db, sid, datetime.now(UTC)).steps
    assert step.policy_version is None and step.output_versions is None


# ----------------------------------------------------------------------------- HTTP and export


@pytest.fixture(scope="module")
def gateway(db_url: str) -> Iterator[httpx.Client]:
    app = create_app(gateway_settings(db_url), upstream_transport=httpx.MockTransport(vllm_like()))
    with LiveServer(app, free_port()) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        yield http


def test_the_route_serves_the_training_view_and_leaves_the_record_view_unchanged(engine, gateway):
    with Session(engine) as db, db.begin():
        sid, _ = three_turns(db, register(db))
    url = f"/v1/sessions/{sid}/trajectory"
    training = gateway.get(url, params={"view": "training"})
    assert training.status_code == 200, training.text
    assert training.json() == view_of(engine, sid).model_dump(mode="json")
    assert training.json()["view"] == "training" and training.json()["sequences"]
    # the record view, byte for byte as before: the Trajectory model's own JSON
    plain, record = gateway.get(url), gateway.get(url, params={"view": "record"})
    with Session(engine) as db:
        expected = load_trajectory(db, sid, datetime.now(UTC)).model_dump_json().encode()
    assert plain.content == record.content == expected


def test_the_trajectory_and_the_admin_record_return_output_versions(engine, gateway):
    crossed = [0, 0, 1, 1, 1, 1, 1]
    with Session(engine) as db, db.begin():
        model = register(db, head=1)
        sid = new_session(db)
        first = completion(db, sid, model, P1, O1, version=0, output_versions=crossed)
        second = completion(db, sid, model, P2, O2, version=1)
    steps = gateway.get(f"/v1/sessions/{sid}/trajectory").json()["steps"]
    assert [s["output_versions"] for s in steps] == [crossed, [1] * len(O2)]
    admin = {"X-Admin-Key": ADMIN_KEY}
    record = gateway.get(f"/admin/completions/{first}", headers=admin)
    assert record.status_code == 200, record.text
    assert record.json()["output_versions"] == crossed and record.json()["policy_version"] == 0
    plain = gateway.get(f"/admin/completions/{second}", headers=admin).json()
    assert plain["output_versions"] == [1] * len(O2)


def test_the_route_answers_errors_in_the_envelope(gateway):
    missing = gateway.get("/v1/sessions/no-such-session/trajectory", params={"view": "training"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "session_not_found"
    bad = gateway.get("/v1/sessions/any/trajectory", params={"view": "samples"})
    assert bad.status_code == 422
    assert set(bad.json()["error"]) >= {"message", "type"} and "view" in bad.text


def test_the_view_is_documented_in_the_openapi_schema(gateway):
    schema = gateway.get("/openapi.json").json()
    op = schema["paths"]["/v1/sessions/{session_id}/trajectory"]["get"]
    (param,) = [p for p in op["parameters"] if p["name"] == "view"]
    assert param["schema"]["enum"] == ["record", "training"]
    refs = {
        r["$ref"] for r in op["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    }
    assert refs == {"#/components/schemas/Trajectory", "#/components/schemas/TrainingView"}
    sequence = schema["components"]["schemas"]["SequenceOut"]["properties"]
    assert {"token_ids", "loss_mask", "logprobs", "versions", "advantages", "cuts", "turns"} <= set(
        sequence
    )


def test_a_tenant_sees_the_training_view_of_its_own_sessions_only(engine, db_url):
    with Session(engine) as db, db.begin():
        sid, _ = three_turns(db, register(db), tenant="alice")
    url = f"/v1/sessions/{sid}/trajectory"
    with (
        auth_gateway(db_url) as gw,
        httpx.Client(base_url=gw, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as admin,
    ):
        with as_key(gw, mint_key(admin, "bob")["key"]) as bob:
            hidden = bob.get(url, params={"view": "training"})
        with as_key(gw, mint_key(admin, "alice")["key"]) as alice:
            shown = alice.get(url, params={"view": "training"})
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "session_not_found"
    assert shown.status_code == 200 and shown.json()["session_id"] == sid


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_writes_one_training_view_per_session(engine, db_url, tmp_path, monkeypatch, capsys):
    with Session(engine) as db, db.begin():
        model = register(db)
        sids = [three_turns(db, model)[0] for _ in range(2)]
        group = new_id("g")
        deadline = datetime.now(UTC) + timedelta(hours=1)
        db.add(
            SessionGroup(
                id=group,
                normalization="mean",
                expected_size=2,
                deadline_at=deadline,
                created_at=tick(),
            )
        )
        db.flush()
        db.execute(update(AgentSession).where(AgentSession.id.in_(sids)).values(group_id=group))
    out = tmp_path / "training.jsonl"
    assert (
        export_command(
            db_url, session_id=None, group_id=group, since=None, out_path=str(out), view="training"
        )
        == 0
    )
    lines = read_jsonl(out)
    assert lines == [view_of(engine, sid).model_dump(mode="json") for sid in sids]

    monkeypatch.setenv("RLGW_DATABASE_URL", db_url)
    cli = tmp_path / "cli.jsonl"
    with pytest.raises(SystemExit) as done:
        main(["export", "--session", sids[0], "--view", "training", "--out", str(cli)])
    assert done.value.code == 0
    assert read_jsonl(cli) == lines[:1]
    with pytest.raises(SystemExit) as record:
        main(["export", "--session", sids[0], "--out", str(cli)])  # the default: the record
    assert record.value.code == 0
    (line,) = read_jsonl(cli)
    assert "steps" in line and "sequences" not in line
    with pytest.raises(SystemExit) as unknown:
        main(["export", "--session", sids[0], "--view", "samples", "--out", str(cli)])
    assert unknown.value.code == 2 and "invalid choice: 'samples'" in capsys.readouterr().err
